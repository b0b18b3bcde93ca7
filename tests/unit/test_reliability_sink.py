"""Span accounting of the OTLP sink while the backend is slow or down: every span
handed to SpanSink is exported, counted as failed, or counted as dropped (no root,
no network: fake exporters)."""
from __future__ import annotations

import threading

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, TraceFlags

from otel_gpu.export.sink import SpanSink


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


def _accounted(sink: SpanSink) -> int:
    s = sink.stats.snapshot()
    return s.get("spans_exported", 0) + s.get("spans_export_failed", 0) + s.get("spans_dropped_queue_full", 0)


@pytest.fixture
def small_batches(monkeypatch):
    monkeypatch.setenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", "4")


def test_failed_exports_count_every_span(small_batches):
    exporter = GatedExporter(SpanExportResult.FAILURE)
    exporter.release.set()
    sink = SpanSink(exporter, console=False, max_queue_size=64, schedule_delay_ms=10)
    for i in range(10):
        sink.emit(_spans(3, 1 + 3 * i))
    sink.shutdown()
    assert sink.stats.snapshot().get("spans_export_failed") == 30
    assert _accounted(sink) == sink.spans_out == 30


def test_queue_full_drops_are_counted_per_span(small_batches):
    exporter = GatedExporter()
    sink = SpanSink(exporter, console=False, max_queue_size=8, schedule_delay_ms=10)
    sink.emit(_spans(4))
    assert exporter.entered.wait(5)  # the worker holds these 4 in a blocked export
    sink.emit(_spans(4, 5))
    sink.emit(_spans(4, 9))  # queue at 8
    sink.emit(_spans(4, 13))  # full: all 4 dropped
    assert sink.stats.snapshot().get("spans_dropped_queue_full") == 4
    exporter.release.set()
    sink.shutdown()
    assert exporter.received == 12
    assert _accounted(sink) == sink.spans_out == 16


def test_a_request_that_overflows_the_queue_is_fully_accounted(small_batches):
    exporter = GatedExporter()
    sink = SpanSink(exporter, console=False, max_queue_size=8, schedule_delay_ms=10)
    sink.emit(_spans(4))
    assert exporter.entered.wait(5)
    for i in range(4):  # queue 0 -> 3 -> 6 -> 9 (> 8): spans fall out of the deque
        sink.emit(_spans(3, 10 + 3 * i))
    exporter.release.set()
    sink.shutdown()
    assert _accounted(sink) == sink.spans_out, (sink.spans_out, sink.stats.snapshot(), exporter.received)


def test_a_queue_smaller_than_the_default_batch_is_accepted(monkeypatch):
    monkeypatch.delenv("OTEL_BSP_MAX_EXPORT_BATCH_SIZE", raising=False)
    exporter = GatedExporter()
    exporter.release.set()
    sink = SpanSink(exporter, console=False, max_queue_size=256, schedule_delay_ms=10)
    sink.emit(_spans(3))
    sink.shutdown()
    assert exporter.received == 3
