"""Collector configuration: CLI flags and environment, validated up front so a bad
value gives one clear error naming the field."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Optional


class ConfigError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"invalid configuration: {field_name}: {message}")
        self.field = field_name


@dataclass
class Config:
    """Every setting of `otel-gpu run`, resolved (flag, else environment, else default)
    and validated once by the loader; nothing else reads the environment for them."""
    pids: list[int] = field(default_factory=list)
    exes: list[str] = field(default_factory=list)
    span_budget: int = 256
    console: bool = False            # print trace trees (resolved: on when no OTLP endpoint)
    route_patterns: list[str] = field(default_factory=list)
    export_query: bool = False
    export_headers: frozenset = frozenset()  # request header names whose values may be exported
    scan_interval_s: float = 2.0
    flush_interval_s: float = 5.0
    ringbuf_pages: int = 2048
    health_file: Optional[str] = None
    gpu_price: str = "0"          # per GPU-hour: "2.5" or "H100=4.1,A100=2.2,default=1.5"
    currency: str = "USD"
    feature_header: Optional[str] = None  # request header naming the feature (default: http.route)
    prometheus_port: Optional[int] = None
    prometheus_addr: str = "0.0.0.0"  # OTEL_GPU_PROMETHEUS_ADDR
    proc_root: str = "/proc"
    # Export. The SDK's OTLP exporters read endpoint, headers and timeout themselves.
    otlp_traces: bool = False     # an OTLP endpoint for traces is configured
    otlp_metrics: bool = False    # ... for metrics
    otlp_protocol: str = "grpc"   # grpc or http/protobuf
    queue_size: int = 8192        # OTEL_BSP_MAX_QUEUE_SIZE: spans queued for OTLP
    export_batch_size: int = 512  # OTEL_BSP_MAX_EXPORT_BATCH_SIZE (capped at queue_size)
    schedule_delay_ms: Optional[int] = None  # OTEL_BSP_SCHEDULE_DELAY (None: SDK default)
    store_path: Optional[str] = None  # local SQLite store; None: off
    resource_attributes: dict = field(default_factory=dict)  # our OTEL_RESOURCE_ATTRIBUTES
    self_service_name: str = "otel-gpu"  # service.name of the collector's own metrics

    def validate(self) -> "Config":
        if self.span_budget < 0 or self.span_budget > 100_000:
            raise ConfigError("span_budget", f"{self.span_budget} is not within 0..100000")
        for pid in self.pids:
            if pid <= 0:
                raise ConfigError("pid", f"{pid} is not a process id")
        if self.ringbuf_pages <= 0 or self.ringbuf_pages & (self.ringbuf_pages - 1):
            raise ConfigError("ringbuf_pages", f"{self.ringbuf_pages} is not a power of two")
        for p in self.route_patterns:
            if not p.startswith("/"):
                raise ConfigError("route", f"pattern {p!r} must start with '/'")
        try:
            from .pipeline.cost import Prices
            Prices(self.gpu_price, self.currency, model="")
        except ValueError as e:
            raise ConfigError("gpu_price", f"{self.gpu_price!r}: {e}") from None
        if self.prometheus_port is not None and not 0 < self.prometheus_port < 65536:
            raise ConfigError("prometheus_port", f"{self.prometheus_port} is not a TCP port")
        if self.scan_interval_s <= 0 or self.flush_interval_s <= 0:
            raise ConfigError("interval", "scan and flush intervals must be positive")
        return self

    @property
    def trace_all(self) -> bool:
        return not (self.pids or self.exes)


def env_list(name: str) -> list[str]:
    return [x.strip() for x in os.environ.get(name, "").split(",") if x.strip()]


def resource_attributes(text: str, strict: bool = True) -> dict:
    """OTEL_RESOURCE_ATTRIBUTES syntax, "k1=v1,k2=v2". `strict`: a malformed pair is a
    ConfigError (our own setting); otherwise it is skipped (a traced process's)."""
    attrs = {}
    for pair in text.split(","):
        k, sep, v = pair.partition("=")
        if sep and k.strip():
            attrs[k.strip()] = v.strip()
        elif strict and pair.strip():
            raise ConfigError("OTEL_RESOURCE_ATTRIBUTES", f"{pair.strip()!r} is not key=value")
    return attrs


def base_resource_attributes(env=os.environ) -> dict:
    """The collector's own OTEL_RESOURCE_ATTRIBUTES, added to every exported resource."""
    return resource_attributes(env.get("OTEL_RESOURCE_ATTRIBUTES", ""))
