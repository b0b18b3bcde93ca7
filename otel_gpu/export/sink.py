"""Where spans go: OTLP (official SDK exporters, batched) when an endpoint is
configured; the console tree and the local store (SQLite) when asked, or when no
endpoint is configured."""
from __future__ import annotations

import logging
import os
import sys
from typing import Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ..ratelimit import RateLimitedLog, Stats
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


class CountingExporter(SpanExporter):
    """Wraps the OTLP exporter: spans the backend refused or never got are counted."""

    def __init__(self, inner: SpanExporter, stats: Stats, log_: RateLimitedLog) -> None:
        self.inner, self.stats, self._log = inner, stats, log_

    def export(self, spans) -> SpanExportResult:
        result = self.inner.export(spans)
        if result == SpanExportResult.SUCCESS:
            self.stats.add("spans_exported", len(spans))
        else:
            self._log.event("spans_export_failed", logging.WARNING,
                            "OTLP export failed: %d spans dropped (backend down?); retrying with new spans",
                            len(spans), count=len(spans))
        return result

    def shutdown(self) -> None:
        self.inner.shutdown()

    def force_flush(self, timeout_millis: int = 30000) -> bool:
        return self.inner.force_flush(timeout_millis)


class SpanSink:
    """Takes the spans of one request/window at a time. The OTLP queue is bounded
    (`max_queue_size` spans): past it new spans are dropped and counted, so memory
    stays flat while a backend is down."""

    def __init__(self, otlp: Optional[SpanExporter], console: bool, out=sys.stdout,
                 max_queue_size: int = 8192, schedule_delay_ms: Optional[int] = None,
                 stats: Optional[Stats] = None, store=None) -> None:
        self.stats = stats or Stats()
        self._log = RateLimitedLog(log, self.stats, interval_s=30.0)
        self.console = ConsoleTreeExporter(out) if console else None
        self.max_queue_size = max_queue_size
        # The SDK refuses an export batch larger than the queue: cap it.
        batch_size = min(int(os.environ.get("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", 512)), max_queue_size)
        self.batch = BatchSpanProcessor(CountingExporter(otlp, self.stats, self._log), max_queue_size=max_queue_size,
                                        schedule_delay_millis=schedule_delay_ms,
                                        max_export_batch_size=batch_size) if otlp else None
        self.store = store  # otel_gpu.store.sink.StoreSink, or None
        self.spans_out = 0

    def _no_room_for(self, n: int) -> bool:
        # A request's spans go in whole or not at all: past the bound the SDK would drop
        # the oldest queued spans silently (one warning each); we count instead.
        queue = getattr(getattr(self.batch, "_batch_processor", None), "_queue", None)
        return queue is not None and len(queue) + n > self.max_queue_size

    def emit(self, spans: Sequence[ReadableSpan]) -> None:
        if not spans:
            return
        self.spans_out += len(spans)
        if self.console:
            self.console.export(spans)
        if self.store:
            self.store.write(spans)
        if self.batch:
            if self._no_room_for(len(spans)):
                self._log.event("spans_dropped_queue_full", logging.WARNING,
                                "OTLP queue full (%d spans): dropping %d new spans", self.max_queue_size,
                                len(spans), count=len(spans))
                return
            for s in spans:
                self.batch.on_end(s)

    def shutdown(self) -> None:
        if self.batch:
            self.batch.force_flush(10_000)
            self.batch.shutdown()
        if self.console:
            self.console.shutdown()
        if self.store:
            self.store.shutdown()
