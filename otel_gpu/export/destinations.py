"""Where spans go: a list of SDK SpanExporters, each handed the spans of ONE record (a
request's SERVER span + children, or one window) at a time. The console tree and the
store draw/write whole traces, so they are called synchronously; OTLP is wrapped in
QueuedExporter, which puts the spans on the SDK's BatchSpanProcessor.

Shutdown is bounded by a deadline whatever the backend does: the local destinations
close first, OTLP flushes until the deadline, and what it had not delivered by then is
counted (spans_dropped_shutdown)."""
from __future__ import annotations

import logging
import threading
import time
from typing import Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import BatchSpanProcessor, SpanExporter, SpanExportResult

from ..ratelimit import RateLimitedLog, Stats
from .bounded import call_by

log = logging.getLogger(__name__)


PROTOCOLS = ("grpc", "http/protobuf")
# A full OTLP queue: how long the pipeline waits for a working exporter to make room
# (per record), and how long a worker may take no batch before it counts as stalled.
ROOM_WAIT_S, STALL_S = 2.0, 0.5


def otlp_span_exporter(protocol: str) -> SpanExporter:
    """The SDK's own exporter; it reads OTEL_EXPORTER_OTLP_{,TRACES_}ENDPOINT/HEADERS/TIMEOUT.
    Over gRPC with the request written by otlp_encoding.py (5x faster here); the SDK's
    HTTP exporter encodes inside export(), so over HTTP the SDK encodes."""
    if protocol == "grpc":
        from .otlp_encoding import GrpcSpanExporter as OTLPSpanExporter
    elif protocol == "http/protobuf":
        from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter
    else:
        raise ValueError(f"OTLP protocol {protocol!r} is not one of {', '.join(PROTOCOLS)}")
    return OTLPSpanExporter()


class _Counting(SpanExporter):
    """Sits between the BatchSpanProcessor and the real exporter: counts the spans that
    left the queue (every export() call) and how each batch ended. Once settled (at the
    shutdown deadline) a batch still in export() is no longer counted when it returns:
    it was counted as not delivered."""

    def __init__(self, inner: SpanExporter, stats: Stats, log_: RateLimitedLog) -> None:
        self.inner, self.stats, self._log = inner, stats, log_
        self._lock = threading.Lock()  # the worker and force_flush both call export()
        self.progress = threading.Condition(self._lock)  # notified when a batch leaves the queue
        self.taken = 0  # handed to export()
        self.ended = 0  # export() returned, delivered or counted as failed
        self._settled = False

    def export(self, spans) -> SpanExportResult:
        with self._lock:
            self.taken += len(spans)
            self.progress.notify_all()
        try:
            result = self.inner.export(spans)
        except Exception as e:  # the SDK would only log it: count the spans as failed
            log.debug("OTLP exporter raised: %r", e)
            result = SpanExportResult.FAILURE
        with self._lock:
            if self._settled:
                return result
            self.ended += len(spans)
            if result == SpanExportResult.SUCCESS:
                self.stats.add("spans_exported", len(spans))
            else:
                self._log.event("spans_export_failed", logging.WARNING,
                                "OTLP export failed: %d spans dropped (backend down?); retrying with new spans",
                                len(spans), count=len(spans))
        return result

    def settle(self, put: int) -> int:
        """Stops counting; returns how many of the `put` spans never ended an export."""
        with self._lock:
            self._settled = True
            return put - self.ended

    def shutdown(self, timeout_millis: float = 0) -> None:  # the processor passes what is left
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
        self._stalled_at = -1  # `taken` when the worker was last found stalled
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
        if self.pending + len(spans) > self.queue_size and not self._wait_for_room(len(spans)):
            self._log.event("spans_dropped_queue_full", logging.WARNING,
                            "OTLP queue full (%d spans): dropping %d new spans", self.queue_size,
                            len(spans), count=len(spans))
            return SpanExportResult.FAILURE
        self._put += len(spans)
        for s in spans:
            self._batch.on_end(s)
        return SpanExportResult.SUCCESS

    def _wait_for_room(self, n: int) -> bool:
        """A full queue while the worker keeps taking batches (the backend is slower than
        the pipeline, not down): the pipeline waits for room, so it is paced by the export
        and the backlog stays in the ring buffer (past its mark the kernel counts calls
        instead of streaming them) rather than spans being dropped. At most ROOM_WAIT_S a
        call; a worker that took nothing for STALL_S (backend slow or down) is not waited
        for again until it takes a batch."""
        deadline = time.monotonic() + ROOM_WAIT_S
        with self._counting.progress:
            while self.pending + n > self.queue_size:
                taken, left = self._counting.taken, deadline - time.monotonic()
                if taken == self._stalled_at or left <= 0:
                    return False
                self._counting.progress.wait(min(STALL_S, left))
                if self._counting.taken == taken and self.pending + n > self.queue_size:
                    self._stalled_at = taken
                    return False
        return True

    def force_flush(self, timeout_millis: int = 10_000) -> bool:
        # The SDK's force_flush ignores its timeout (it exports everything in this thread).
        return call_by(time.monotonic() + timeout_millis / 1000, self._batch.force_flush, "OTLP flush")

    def shutdown(self, deadline: Optional[float] = None) -> None:
        """Exports what is queued until `deadline` (time.monotonic(); default 5 s from
        now), then gives up: the processor's worker stops taking batches and the exporter
        is shut (gRPC cancels the call in flight). Spans not delivered are counted."""
        if self._closed:
            return
        self._closed = True
        deadline = time.monotonic() + 5 if deadline is None else deadline
        # BatchSpanProcessor.shutdown() takes no timeout (it waits up to 30 s): it is
        # left behind at the deadline, on a daemon thread.
        call_by(deadline, self._batch.shutdown, "OTLP shutdown")
        lost = self._counting.settle(self._put)
        if lost:
            self._log.event("spans_dropped_shutdown", logging.WARNING,
                            "OTLP: %d spans not delivered by the shutdown deadline (backend slow or not answering)",
                            lost, count=lost)


WHOLE, SUMMARY, NOTHING = "whole", "summary", "nothing"  # Destinations.unsampled


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

    @property
    def unsampled(self) -> str:
        """What the destinations keep of an unsampled request that did not end in an error:
        WHOLE, its spans (the console); SUMMARY, its SERVER span, which the store sums
        (store/summaries.py: an exporter with `summarises_unsampled`); NOTHING (OTLP drops
        an unsampled trace)."""
        kinds = {NOTHING if isinstance(e, QueuedExporter) else SUMMARY if getattr(e, "summarises_unsampled", False)
                 else WHOLE for _, e in self.exporters}
        return WHOLE if WHOLE in kinds else SUMMARY if SUMMARY in kinds else NOTHING

    def tick(self) -> None:
        """The pipeline's Tick: destinations that write on a timer (the store's summaries)."""
        self._each("tick")

    def begin_batch(self) -> None:
        """A pipeline batch begins: destinations that write in batches (the store) keep
        what they are given until end_batch()."""
        self._each("begin_batch")

    def end_batch(self) -> None:
        self._each("end_batch")

    def _each(self, method: str) -> None:
        """`method` of each destination that has it; one failing does not stop the others."""
        for name, exporter in self.exporters:
            call = getattr(exporter, method, None)
            if call is None:
                continue
            try:
                call()
            except Exception as e:
                self._log.event(f"{name}_export_errors", logging.WARNING, "%s destination failed: %s", name, e)

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

    def settle_cost(self, request, currency: str) -> None:
        """A request's cost settled after its span left: to the destinations that keep
        request summaries (the local store); a span once sent cannot change."""
        for name, exporter in self.exporters:
            settle = getattr(exporter, "settle_cost", None)
            if settle is None:
                continue
            try:
                settle(request.trace_id, request.span_id, request.gpu_seconds, request.cost, currency)
            except Exception as e:
                self._log.event(f"{name}_export_errors", logging.WARNING, "%s destination failed: %s", name, e)

    def shutdown(self, deadline: Optional[float] = None) -> None:
        """Local destinations close at once; OTLP (last in the list) flushes until `deadline`."""
        for name, exporter in self.exporters:
            try:
                if isinstance(exporter, QueuedExporter):
                    exporter.shutdown(deadline)
                else:
                    exporter.shutdown()
            except Exception as e:
                log.warning("%s destination: shutdown failed: %s", name, e)
