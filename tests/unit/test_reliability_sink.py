"""Span accounting of the OTLP destination while the backend is slow or down: every span
handed to Destinations is exported, counted as failed, or counted as dropped (no root,
no network: fake exporters)."""
from __future__ import annotations

import threading
import time

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from otel_gpu.export.destinations import STALL_S, Destinations, QueuedExporter
from otel_gpu.ratelimit import Stats


def _spans(n: int, start: int = 1) -> list:
    return [ReadableSpan(name=f"s{i}", context=SpanContext(1, i, False, TraceFlags(TraceFlags.SAMPLED)))
            for i in range(start, start + n)]


class GatedExporter(SpanExporter):
    """Blocks in export() until released; then answers `result`."""

    def __init__(self, result=SpanExportResult.SUCCESS) -> None:
        self.result = result
        self.entered = threading.Event()
        self.release = threading.Event()
        self.received = 0

    def export(self, spans):
        self.entered.set()
        self.release.wait(10)
        self.received += len(spans)
        return self.result

    def shutdown(self):
        pass


def _otlp(exporter: SpanExporter, queue_size: int, batch_size: int = 4) -> Destinations:
    stats = Stats()
    q = QueuedExporter(exporter, stats, queue_size=queue_size, export_batch_size=batch_size, schedule_delay_ms=10)
    return Destinations([("otlp", q)], stats)


def _accounted(d: Destinations) -> int:
    s = d.stats.snapshot()
    return s.get("spans_exported", 0) + s.get("spans_export_failed", 0) + s.get("spans_dropped_queue_full", 0)


def test_failed_exports_count_every_span():
    exporter = GatedExporter(SpanExportResult.FAILURE)
    exporter.release.set()
    d = _otlp(exporter, 64)
    for i in range(10):
        d.export(_spans(3, 1 + 3 * i))
    d.shutdown()
    assert d.stats.snapshot().get("spans_export_failed") == 30
    assert _accounted(d) == d.spans_out == 30


def test_an_exporter_that_raises_counts_as_failed():
    class Raising(GatedExporter):
        def export(self, spans):
            raise ConnectionError("backend gone")
    d = _otlp(Raising(), 64)
    d.export(_spans(5))
    d.shutdown()
    assert d.stats.snapshot().get("spans_export_failed") == 5 == d.spans_out


def test_queue_full_drops_are_counted_per_span():
    exporter = GatedExporter()
    d = _otlp(exporter, 8)
    d.export(_spans(4))
    assert exporter.entered.wait(5)  # the worker holds these 4 in a blocked export
    d.export(_spans(4, 5))
    d.export(_spans(4, 9))  # queue at 8
    d.export(_spans(4, 13))  # full: all 4 dropped
    assert d.stats.snapshot().get("spans_dropped_queue_full") == 4
    exporter.release.set()
    d.shutdown()
    assert exporter.received == 12
    assert _accounted(d) == d.spans_out == 16


def test_a_record_goes_in_whole_or_not_at_all():
    """Counters exact: a record that does not fit is dropped entirely, a smaller later
    one that fits still goes in."""
    exporter = GatedExporter()
    d = _otlp(exporter, 8)
    (_, q), = d.exporters
    d.export(_spans(4))
    assert exporter.entered.wait(5)
    assert q.pending == 0  # taken by the blocked worker: no longer in the queue
    d.export(_spans(3, 10))
    d.export(_spans(3, 20))
    assert q.pending == 6
    d.export(_spans(3, 30))  # 6 + 3 > 8: all three dropped, none queued
    assert q.pending == 6 and d.stats.snapshot() == {"spans_dropped_queue_full": 3}
    d.export(_spans(2, 40))  # 6 + 2 fits
    assert q.pending == 8
    exporter.release.set()
    d.shutdown()
    assert d.stats.snapshot() == {"spans_dropped_queue_full": 3, "spans_exported": 12}
    assert exporter.received == 12 and d.spans_out == 15 and q.pending == 0


def test_a_request_that_overflows_the_queue_is_fully_accounted():
    exporter = GatedExporter()
    d = _otlp(exporter, 8)
    d.export(_spans(4))
    assert exporter.entered.wait(5)
    for i in range(4):  # pending 0 -> 3 -> 6 -> (9 > 8: dropped whole)
        d.export(_spans(3, 10 + 3 * i))
    exporter.release.set()
    d.shutdown()
    assert _accounted(d) == d.spans_out, (d.spans_out, d.stats.snapshot(), exporter.received)


def test_a_queue_smaller_than_the_default_batch_is_accepted():
    exporter = GatedExporter()
    exporter.release.set()
    d = _otlp(exporter, 256, batch_size=512)  # the SDK refuses batch > queue: capped
    d.export(_spans(3))
    d.shutdown()
    assert exporter.received == 3


def test_unsampled_spans_do_not_hold_queue_room():
    exporter = GatedExporter()
    exporter.release.set()
    d = _otlp(exporter, 8)
    (_, q), = d.exporters
    d.export([ReadableSpan(name="x", context=SpanContext(1, i, False, TraceFlags(0))) for i in range(1, 20)])
    assert q.pending == 0
    d.shutdown()


def test_shutdown_with_a_backend_that_never_answers_ends_by_its_deadline_and_counts():
    """The exporter hangs in export() (an endpoint that never answers): shutdown still
    returns at its deadline, and every span not delivered is counted once, even when the
    hung export returns later."""
    import time
    exporter = GatedExporter()
    d = _otlp(exporter, 64)
    d.export(_spans(4))
    assert exporter.entered.wait(5)  # 4 in a hung export
    d.export(_spans(6, 10))          # 6 queued behind it
    t0 = time.monotonic()
    d.shutdown(time.monotonic() + 0.5)
    assert time.monotonic() - t0 < 2.0
    assert d.stats.snapshot() == {"spans_dropped_shutdown": 10}
    exporter.release.set()  # the hung export returns "delivered" after the deadline...
    deadline = time.monotonic() + 5
    while exporter.received < 4 and time.monotonic() < deadline:
        time.sleep(0.01)
    assert exporter.received >= 4
    time.sleep(0.1)
    assert d.stats.snapshot() == {"spans_dropped_shutdown": 10}  # ...and is not counted twice


class SlowExporter(SpanExporter):
    """A working backend slower than the pipeline: each batch takes `delay_s`."""

    def __init__(self, delay_s: float) -> None:
        self.delay_s, self.received = delay_s, 0

    def export(self, spans):
        threading.Event().wait(self.delay_s)
        self.received += len(spans)
        return SpanExportResult.SUCCESS

    def shutdown(self):
        pass


def test_a_slow_but_working_backend_paces_the_pipeline_instead_of_dropping():
    exporter = SlowExporter(0.01)
    d = _otlp(exporter, 8)
    for i in range(40):  # 160 spans through a queue of 8: the producer waits for room
        d.export(_spans(4, 1 + 4 * i))
    d.shutdown()
    assert d.stats.snapshot() == {"spans_exported": 160} and exporter.received == 160


def test_a_stalled_backend_is_waited_for_once_then_drops_at_once():
    exporter = GatedExporter()
    d = _otlp(exporter, 8)
    d.export(_spans(4))
    assert exporter.entered.wait(5)
    d.export(_spans(8, 5))  # queue full
    t0 = time.monotonic()
    d.export(_spans(4, 13))  # the worker takes nothing: waited STALL_S, then dropped
    d.export(_spans(4, 17))  # known stalled: dropped without waiting
    waited = time.monotonic() - t0
    assert d.stats.snapshot().get("spans_dropped_queue_full") == 8
    assert waited < STALL_S + 1.0  # not ROOM_WAIT_S twice
    exporter.release.set()
    d.shutdown()
    assert _accounted(d) == d.spans_out == 20
