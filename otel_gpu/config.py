"""Collector configuration: every setting (Config), its defaults and choices, the parsers
of the values that have a syntax, and one validation, so a bad value gives one clear
error naming the flag's field or the variable. Where the values come from (the `run`
flags, the environment) is config_loader.py. Imports nothing of the rest of the package:
every part of it reads its settings from here."""
from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Mapping, Optional

DEFAULT_BPF_CACHE = "/var/cache/otel-gpu"
DEFAULT_STATUS_FILE = "/run/otel-gpu/status.json"  # what `otel-gpu status` reads (status/file.py)
# Device-clock mode's flag file (device_clock/flag.py): cupti/otel_gpu_cupti.c's default too.
DEFAULT_DEVICE_CLOCK_FLAG = "/run/otel-gpu/device-clock"
# --uprobe-links: auto (links where the kernel has them), or one of the two (probes/uprobe_links.py).
UPROBE_LINKS = ("auto", "multi", "perf")

OTLP_PROTOCOLS = ("grpc", "http/protobuf")
LOG_LEVELS = ("debug", "info", "warning", "error", "critical")
MIN_CONNECTIONS, MAX_CONNECTIONS = 16, 1 << 20  # --max-connections: the BPF map's bounds
# --stream-rate's default: calls/s streamed one by one host-wide, scaled by a ratio
# sampler's ratio (default_stream_rate), never below the floor.
STREAM_RATE, STREAM_RATE_FLOOR = 5000, 100


class ConfigError(ValueError):
    def __init__(self, field_name: str, message: str) -> None:
        super().__init__(f"invalid configuration: {field_name}: {message}")
        self.field = field_name
        self.reason = message


@dataclass
class Config:
    """Every setting of `otel-gpu run`, resolved (flag, else environment, else default)
    and validated once by the loader; nothing else reads the environment for them."""
    pids: list[int] = field(default_factory=list)
    exes: list[str] = field(default_factory=list)
    span_budget: int = 256
    stream_budget: int = 64  # CUDA calls streamed per thread and request; the rest counted in the kernel
    # CUDA calls streamed per second, host-wide; the rest counted in the kernel. None: follows
    # the sampler (default_stream_rate), resolved as the Config is made.
    stream_rate: Optional[int] = None
    console: bool = False            # print trace trees (resolved: on when no OTLP endpoint)
    route_patterns: list[str] = field(default_factory=list)
    max_routes: int = 100  # distinct http.route (and feature) values per service; later ones fold
    export_query: bool = False
    export_command_line: bool = False  # process.command_line (argv may hold secrets)
    export_headers: frozenset = frozenset()  # request header names whose values may be exported
    scan_interval_s: float = 2.0
    flush_interval_s: float = 5.0
    ringbuf_pages: int = 2048
    max_connections: int = 65536  # in-kernel table of traced processes' connections
    health_file: Optional[str] = None
    gpu_price: str = "0"          # per GPU-hour: "2.5" or "H100=4.1,A100=2.2,default=1.5"
    currency: str = "USD"
    feature_header: Optional[str] = None  # request header naming the feature (default: http.route)
    prometheus_port: Optional[int] = None
    prometheus_addr: str = "127.0.0.1"  # OTEL_GPU_PROMETHEUS_ADDR: localhost unless told otherwise
    proc_root: str = "/proc"
    nvidia_procfs: str = "/proc/driver/nvidia"  # OTEL_GPU_NVIDIA_PROCFS: GPU models and uuids (gpu_devices.py)
    amd_sysfs: str = "/sys"  # OTEL_GPU_AMD_SYSFS: AMD GPU models and uuids, the KFD topology (gpu_devices.py)
    # Export. The SDK's OTLP exporters read endpoint, headers and timeout themselves.
    otlp_traces: bool = False     # an OTLP endpoint for traces is configured
    otlp_metrics: bool = False    # ... for metrics
    otlp_protocol: str = "grpc"   # grpc or http/protobuf
    queue_size: int = 8192        # OTEL_BSP_MAX_QUEUE_SIZE: spans queued for OTLP
    export_batch_size: int = 512  # OTEL_BSP_MAX_EXPORT_BATCH_SIZE (capped at queue_size)
    # OTEL_BSP_SCHEDULE_DELAY: the SDK's 5 s suits an app; an agent's spans should arrive within
    # seconds, and at a low span rate a 512-span batch waits for this timer.
    schedule_delay_ms: int = 1000
    metric_interval_ms: int = 10_000  # OTEL_METRIC_EXPORT_INTERVAL (the SDK's 60 s is coarse for an agent)
    # OTEL_SPAN_LINK_COUNT_LIMIT: links on one window's span (the OpenTelemetry default); a busy
    # process's ambiguous window can have thousands of candidate requests in one flush.
    max_links: int = 128
    store_path: Optional[str] = None  # local SQLite store; None: off
    status_file: Optional[str] = None  # state file read by `otel-gpu status`; None: off
    device_clock_flag: Optional[str] = None  # device-clock mode's flag file (device_clock/flag.py); None: off
    bpf_cache: Optional[str] = DEFAULT_BPF_CACHE  # compiled BPF programs (probes/program_cache.py); None: off
    store_group: Optional[int] = None  # gid that may read the store (file 0640, dir 0750); None: 0600/0700
    shutdown_timeout_s: int = 5   # SIGTERM to exit, whatever the backend does; undelivered spans are counted
    resource_attributes: dict = field(default_factory=dict)  # our OTEL_RESOURCE_ATTRIBUTES
    self_service_name: str = "otel-gpu"  # service.name of the collector's own metrics
    python_context: bool = True   # probe Python interpreters for asyncio task / context attribution
    go_goroutines: bool = True    # read Go processes' goroutines for attribution (bpf/go_probes.c)
    time_split: bool = True       # the sched tracepoint of the time split (bpf/sched_probes.c); --no-time-split
    traces_sampler: str = "parentbased_always_on"  # OTEL_TRACES_SAMPLER (pipeline/sampling.py)
    traces_sampler_arg: Optional[str] = None        # OTEL_TRACES_SAMPLER_ARG: the ratio
    uprobe_links: str = "auto"    # auto, multi or perf: how uprobes are planted (probes/uprobe_links.py)
    log_level: str = "info"

    def __post_init__(self) -> None:
        if self.stream_rate is None:
            try:
                self.stream_rate = default_stream_rate(self.traces_sampler, self.traces_sampler_arg)
            except ValueError:  # a bad sampler: validate() says so
                self.stream_rate = STREAM_RATE

    def validate(self) -> "Config":
        if self.span_budget < 0 or self.span_budget > 100_000:
            raise ConfigError("span_budget", f"{self.span_budget} is not within 0..100000")
        if self.stream_budget < 0 or self.stream_budget > 100_000:
            raise ConfigError("stream_budget", f"{self.stream_budget} is not within 0..100000")
        if self.stream_rate < 0 or self.stream_rate > 10_000_000:
            raise ConfigError("stream_rate", f"{self.stream_rate} is not within 0..10000000")
        for pid in self.pids:
            if pid <= 0:
                raise ConfigError("pid", f"{pid} is not a process id")
        if self.ringbuf_pages <= 0 or self.ringbuf_pages & (self.ringbuf_pages - 1):
            raise ConfigError("ringbuf_pages", f"{self.ringbuf_pages} is not a power of two")
        if not MIN_CONNECTIONS <= self.max_connections <= MAX_CONNECTIONS:
            raise ConfigError("max_connections",
                              f"{self.max_connections} is not within {MIN_CONNECTIONS}..{MAX_CONNECTIONS}")
        if self.max_routes < 1 or self.max_routes > 100_000:
            raise ConfigError("max_routes", f"{self.max_routes} is not within 1..100000")
        for p in self.route_patterns:
            if not p.startswith("/"):
                raise ConfigError("route", f"pattern {p!r} must start with '/'")
        try:
            price_table(self.gpu_price)
        except ValueError as e:
            raise ConfigError("gpu_price", f"{self.gpu_price!r}: {e}") from None
        try:
            sampler_ratio(self.traces_sampler, self.traces_sampler_arg)
        except ValueError as e:
            raise ConfigError("OTEL_TRACES_SAMPLER", str(e)) from None
        if self.prometheus_port is not None and not 0 < self.prometheus_port < 65536:
            raise ConfigError("prometheus_port", f"{self.prometheus_port} is not a TCP port")
        try:
            import ipaddress
            ipaddress.ip_address(self.prometheus_addr)
        except ValueError:
            raise ConfigError("prometheus_addr", f"{self.prometheus_addr!r} is not an IP address") from None
        if self.scan_interval_s <= 0 or self.flush_interval_s <= 0:
            raise ConfigError("interval", "scan and flush intervals must be positive")
        if self.otlp_protocol not in OTLP_PROTOCOLS:
            raise ConfigError("otlp_protocol", f"{self.otlp_protocol!r} is not one of {', '.join(OTLP_PROTOCOLS)}")
        if self.bpf_cache is not None and not os.path.isabs(self.bpf_cache):
            raise ConfigError("bpf_cache", f"{self.bpf_cache!r} is not an absolute path (or off)")
        if self.uprobe_links not in UPROBE_LINKS:
            raise ConfigError("uprobe_links", f"{self.uprobe_links!r} is not one of {', '.join(UPROBE_LINKS)}")
        if self.log_level not in LOG_LEVELS:
            raise ConfigError("log_level", f"{self.log_level!r} is not one of {', '.join(LOG_LEVELS)}")
        return self

    @property
    def trace_all(self) -> bool:
        return not (self.pids or self.exes)


def env_list(name: str, env: Optional[Mapping[str, str]] = None) -> list[str]:
    env = os.environ if env is None else env
    return [x.strip() for x in env.get(name, "").split(",") if x.strip()]


def price_table(spec: str) -> dict[str, float]:
    """--gpu-price: "2.5", or per device model "H100=4.1,A100=2.2,default=1.5" -> {model
    (lowercase) or "default": price per GPU-hour}; ValueError for a bad or negative one."""
    table: dict[str, float] = {}
    for part in (p.strip() for p in spec.split(",") if p.strip()):
        name, sep, value = part.rpartition("=")
        table[name.strip().lower() if sep else "default"] = float(value)
    if any(v < 0 for v in table.values()):
        raise ValueError("prices must not be negative")
    return table


SAMPLERS = ("always_on", "always_off", "traceidratio", "parentbased_always_on", "parentbased_always_off",
            "parentbased_traceidratio")  # OTEL_TRACES_SAMPLER values (pipeline/sampling.py builds them)


def sampler_ratio(name: str, arg: Optional[str]) -> float:
    """The ratio of a traceidratio sampler (1 for the others, or with no argument);
    ValueError for a name not in SAMPLERS or a ratio outside 0..1."""
    if name not in SAMPLERS:
        raise ValueError(f"{name!r} is not one of {', '.join(SAMPLERS)}")
    if not name.endswith("traceidratio") or arg in (None, ""):
        return 1.0
    ratio = float(arg)
    if not 0.0 <= ratio <= 1.0:
        raise ValueError(f"ratio {arg!r} is not within 0..1")
    return ratio


def default_stream_rate(sampler: str, arg: Optional[str]) -> int:
    """--stream-rate when it is not given: STREAM_RATE times a traceidratio sampler's
    ratio, at least STREAM_RATE_FLOOR. Calls are streamed one by one for sampled requests
    alone (an unsampled one's are counted in the kernel), so at 10 % a tenth of the rate
    gives each sampled trace the detail it has at 100 %, and the collector's work follows
    the ratio. The other samplers keep the whole rate: what they sample is all or nothing
    (the always_* samplers) or the parents' choice. The floor keeps detail for the traces
    a parent samples under a tiny ratio."""
    return max(round(STREAM_RATE * sampler_ratio(sampler, arg)), STREAM_RATE_FLOOR)


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
