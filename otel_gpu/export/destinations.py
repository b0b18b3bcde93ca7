"""Where spans go: a list of SDK SpanExporters, each handed the spans of ONE record (a
request's SERVER span + children, or one window) at a time. The console tree and the
store draw/write whole traces, so they are called synchronously; OTLP is wrapped in
QueuedExporter, which puts the spans on the SDK's BatchSpanProcessor."""
from __future__ import annotations

import logging
import threading
from typing import Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ..ratelimit import RateLimitedLog, Stats

log = logging.getLogger(__name__)


PROTOCOLS = ("grpc", "http/protobuf")


def otlp_span_exporter(protocol: str) -> SpanExporter:
    """The SDK's own exporter; it reads OTEL_EXPORTER_OTLP_{,TRACES_}ENDPOINT/HEADERS/TIMEOUT."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        raise ValueError(f"OTLP protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    return OTLPSpanExporter()


class _Counting(SpanExporter):
    """Sits between the BatchSpanProcessor and the real exporter: counts the spans that
    left the queue (every export() call) and how each batch ended."""

    def __init__(self, inner: SpanExporter, stats: Stats, log_: RateLimitedLog) -> None:
        self.inner, self.stats, self._log = inner, stats, log_
        self._lock = threading.Lock()  # the worker and force_flush both call export()
        self.taken = 0

    def export(self, spans) -> SpanExportResult:
        with self._lock:
            self.taken += len(spans)
        try:
            result = self.inner.export(spans)
        except Exception as e:  # the SDK would only log it: count the spans as failed
            log.debug("OTLP exporter raised: %r", e)
            result = SpanExportResult.FAILURE
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


class QueuedExporter(SpanExporter):
    """`inner` behind the SDK BatchSpanProcessor with a bounded queue. A record's spans go
    in whole or not at all: past `queue_size` pending spans they are dropped and counted
    (the SDK would drop the oldest queued spans, one warning each). Pending is what went
    in minus what the processor handed to export(): no private SDK field is read."""

    def __init__(self, inner: SpanExporter, stats: Stats, queue_size: int = 8192,
                 export_batch_size: int = 512, schedule_delay_ms: Optional[int] = None) -> None:
        self.inner, self.stats, self.queue_size = inner, stats, queue_size
        self._log = RateLimitedLog(log, stats, interval_s=30.0)
        self._counting = _Counting(inner, stats, self._log)
        self._put = 0
        self._closed = False
        # The SDK refuses an export batch larger than the queue: cap it.
        self._batch = BatchSpanProcessor(self._counting, max_queue_size=queue_size,
                                         schedule_delay_millis=schedule_delay_ms,
                                         max_export_batch_size=min(export_batch_size, queue_size))

    @property
    def pending(self) -> int:
        """Spans in the queue, or taken from it and not yet handed to export()."""
        return self._put - self._counting.taken

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        # The processor ignores unsampled spans: counting them would leak `pending`.
        spans = [s for s in spans if s.context is not None and s.context.trace_flags.sampled]
        if self._closed:
            return SpanExportResult.FAILURE
        if not spans:
            return SpanExportResult.SUCCESS
        if self.pending + len(spans) > self.queue_size:
            self._log.event("spans_dropped_queue_full", logging.WARNING,
                            "OTLP queue full (%d spans): dropping %d new spans", self.queue_size,
                            len(spans), count=len(spans))
            return SpanExportResult.FAILURE
        self._put += len(spans)
        for s in spans:
            self._batch.on_end(s)
        return SpanExportResult.SUCCESS

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        return self._batch.force_flush(timeout_millis)

    def shutdown(self) -> None:
        if not self._closed:
            self._closed = True
            self._batch.force_flush(10_000)
            self._batch.shutdown()


class Destinations:
    """The collector's one export list: (name, exporter) pairs, called in order with the
    spans of one record. One destination failing (a full disk, a closed stdout) does not
    keep the record from the others."""

    def __init__(self, exporters: Sequence[tuple[str, SpanExporter]], stats: Stats) -> None:
        self.exporters = list(exporters)
        self.stats = stats
        self._log = RateLimitedLog(log, stats, interval_s=30.0)
        self.spans_out = 0  # spans handed in, whatever became of them

    @property
    def names(self) -> list[str]:
        return [name for name, _ in self.exporters]

    def export(self, spans: Sequence[ReadableSpan]) -> None:
        if not spans:
            return
        self.spans_out += len(spans)
        for name, exporter in self.exporters:
            try:
                exporter.export(spans)
            except Exception as e:
                self._log.event(f"{name}_export_errors", logging.WARNING,
                                "%s destination failed: %s", name, e)

    def shutdown(self) -> None:
        for name, exporter in self.exporters:
            try:
                exporter.shutdown()
            except Exception as e:
                log.warning("%s destination: shutdown failed: %s", name, e)
