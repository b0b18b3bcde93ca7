"""Where spans go: OTLP (official SDK exporters, batched) when an endpoint is
configured, the console tree when asked or when nothing else is configured."""
from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter

from .console import ConsoleTreeExporter

log = logging.getLogger(__name__)

PROTOCOLS = ("grpc", "http/protobuf")


def otlp_configured(env=os.environ) -> bool:
    return bool(env.get("OTEL_EXPORTER_OTLP_TRACES_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"))


def otlp_protocol(env=os.environ) -> str:
    proto = (env.get("OTEL_EXPORTER_OTLP_TRACES_PROTOCOL") or env.get("OTEL_EXPORTER_OTLP_PROTOCOL")
             or "grpc").strip()
    if proto not in PROTOCOLS:
        raise ValueError(f"OTEL_EXPORTER_OTLP_PROTOCOL: {proto!r} is not one of {', '.join(PROTOCOLS)}")
    return proto


def make_otlp_exporter(env=os.environ) -> SpanExporter:
    """The SDK exporters read OTEL_EXPORTER_OTLP_{,TRACES_}ENDPOINT/HEADERS/TIMEOUT themselves."""
    if otlp_protocol(env) == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    return OTLPSpanExporter()


class SpanSink:
    """Takes the spans of one request/window at a time."""

    def __init__(self, otlp: Optional[SpanExporter], console: bool, out=sys.stdout,
                 max_queue_size: int = 8192, schedule_delay_ms: int = 1000) -> None:
        self.console = ConsoleTreeExporter(out) if console else None
        self.batch = BatchSpanProcessor(otlp, max_queue_size=max_queue_size,
                                        schedule_delay_millis=schedule_delay_ms) if otlp else None
        self.spans_out = 0

    def emit(self, spans: Sequence[ReadableSpan]) -> None:
        if not spans:
            return
        self.spans_out += len(spans)
        if self.console:
            self.console.export(spans)
        if self.batch:
            for s in spans:
                self.batch.on_end(s)

    def shutdown(self) -> None:
        if self.batch:
            self.batch.force_flush(10_000)
            self.batch.shutdown()
        if self.console:
            self.console.shutdown()
