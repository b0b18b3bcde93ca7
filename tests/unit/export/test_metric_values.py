"""Metric values that always encode: a cudaMemcpy of 2^64-1 bytes is clamped per call,
no series sums past int64, and the real OTLP/gRPC exporter keeps exporting to a real
receiver afterwards; an exporter that raises is counted, never a traceback."""
import logging

from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
from opentelemetry.sdk.metrics.export import (InMemoryMetricReader, MetricExporter,
                                              PeriodicExportingMetricReader)
from opentelemetry.sdk.resources import Resource

from otel_gpu import semconv as sc
from otel_gpu.export.metric_values import INT64_MAX, MAX_CALL_BYTES, BatchedAdds, BatchedRecords, GuardedExporter, encodable
from otel_gpu.export.metrics import GpuMetrics
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.model import CallSink, Request
from otel_gpu.ratelimit import Stats
from tests.support.otlp_receiver import OtlpReceiver
from tests.unit.pipeline.calls import cuda


def _request(nbytes: int, n: int = 1) -> Request:
    r = Request(1, 1, 3, RequestHead("GET", "/x", "1.1", {}), 1_000, n, n, CallSink(8), end_ns=2_000, status=200)
    r.sink.add(cuda("cudaMemcpy", nbytes=nbytes, kind=1), "thread")
    r.resource, r.route = Resource({sc.SERVICE_NAME: "svc"}), "/x"
    return r


def _copied(reader) -> list:
    """The bytes of gpu.cuda.memory.copies (a histogram of bytes per copy), per series."""
    data = reader.get_metrics_data()
    return [p.sum for rm in data.resource_metrics for sm in rm.scope_metrics for m in sm.metrics
            if m.name == "gpu.cuda.memory.copies" for p in m.data.data_points]


def test_one_absurd_copy_is_clamped_per_call_and_counted():
    reader, stats = InMemoryMetricReader(), Stats()
    m = GpuMetrics([reader], stats)
    m.process([_request(2**64 - 1), _request(100, 2)])
    assert _copied(reader) == [MAX_CALL_BYTES + 100]
    assert stats.snapshot()["metric_values_clamped"] == 1


def test_no_series_sums_past_int64():
    reader, stats = InMemoryMetricReader(), Stats()
    m = GpuMetrics([reader], stats)
    m.apis["cuda"].allocations.add(INT64_MAX - 10, {"k": "v"})
    m.apis["cuda"].allocations.add(100, {"k": "v"})
    m.apis["cuda"].allocations.add(1, {"k": "w"})
    data = reader.get_metrics_data()
    values = sorted(p.value for rm in data.resource_metrics for sm in rm.scope_metrics for mt in sm.metrics
                    if mt.name == "gpu.cuda.memory.allocations" for p in mt.data.data_points)
    assert values == [1, INT64_MAX]
    assert stats.snapshot()["metric_values_clamped"] == 1


def test_metrics_keep_going_out_over_otlp_after_an_absurd_copy():
    receiver = OtlpReceiver().start()
    stats = Stats()
    try:
        exporter = GuardedExporter(OTLPMetricExporter(endpoint=receiver.endpoint, insecure=True), stats)
        reader = PeriodicExportingMetricReader(exporter, export_interval_millis=3_600_000)
        m = GpuMetrics([reader], stats)
        m.process([_request(2**64 - 1)])
        assert reader.force_flush(10_000)
        # even a point past int64 that reached the exporter some other way is encoded
        m.apis["cuda"].allocations.counter.add(2**64, {"k": "v"})
        m.process([_request(4096, 2)])
        assert reader.force_flush(10_000)
        assert len(receiver.metric_requests) == 2
        last = receiver.metric_requests[-1]
        metrics = {mt.name: mt for rm in last.resource_metrics for sm in rm.scope_metrics for mt in sm.metrics}
        assert [p.as_int for p in metrics["gpu.cuda.memory.allocations"].sum.data_points] == [INT64_MAX]
        assert [p.sum for p in metrics["gpu.cuda.memory.copies"].histogram.data_points] == [MAX_CALL_BYTES + 4096]
        assert "metrics_export_failed" not in stats.snapshot()
        m.provider.shutdown()
    finally:
        receiver.stop()


class _Raising(MetricExporter):
    def __init__(self):
        super().__init__()
        self.calls = 0

    def export(self, metrics_data, timeout_millis=10_000, **kw):
        self.calls += 1
        raise ValueError("Value out of range")

    def force_flush(self, timeout_millis=10_000):
        return True

    def shutdown(self, timeout_millis=30_000, **kw):
        pass


def test_an_exporter_that_raises_is_counted_and_the_next_export_still_runs(caplog):
    stats, inner = Stats(), _Raising()
    reader = PeriodicExportingMetricReader(GuardedExporter(inner, stats), export_interval_millis=3_600_000)
    m = GpuMetrics([reader], stats)
    m.process([_request(10)])
    with caplog.at_level(logging.WARNING):
        reader.force_flush(5_000)
        reader.force_flush(5_000)
    assert inner.calls == 2 and stats.snapshot()["metrics_export_failed"] == 2
    assert "Traceback" not in caplog.text and "metrics export failed: ValueError" in caplog.text
    m.provider.shutdown()


def test_encodable_leaves_good_data_alone():
    reader = InMemoryMetricReader()
    m = GpuMetrics([reader], Stats())
    m.process([_request(10)])
    data = reader.get_metrics_data()
    assert encodable(data, Stats()) is data


def test_service_name_labels_are_bounded():
    """A traced process names its own service (OTEL_SERVICE_NAME): processes that churn
    through names fold into `other` past MAX_SERVICES, counted."""
    from otel_gpu.export.metrics import OTHER
    from otel_gpu.value_cap import MAX_SERVICES

    reader, stats = InMemoryMetricReader(), Stats()
    m = GpuMetrics([reader], stats)
    for i in range(MAX_SERVICES + 40):
        r = _request(10)
        r.resource = Resource({sc.SERVICE_NAME: f"svc-{i}"})
        m.process([r])
    data = reader.get_metrics_data()
    names = {p.attributes[sc.SERVICE_NAME] for rm in data.resource_metrics for sm in rm.scope_metrics
             for mt in sm.metrics if mt.name == "gpu.cuda.memory.copies" for p in mt.data.data_points}
    assert len(names) == MAX_SERVICES + 1 and OTHER in names
    assert stats.snapshot()["services_folded"] >= 40


class Counter:
    """What BatchedAdds calls: the SDK counter's add()."""

    def __init__(self):
        self.adds = []

    def add(self, n, attributes):
        self.adds.append((n, attributes))


def test_batched_adds_make_one_add_per_series_and_batch():
    a, b, adds = Counter(), Counter(), BatchedAdds()
    for route in ("/x", "/y", "/x"):
        adds.add(a, 2, (("http.route", route), ("service.name", "s")))
    adds.add(b, 0.5, (("http.route", "/x"),))
    adds.add(b, 0.25, (("http.route", "/x"),))
    assert a.adds == [] and b.adds == []  # nothing before the batch ends
    adds.flush()
    assert sorted(a.adds, key=lambda x: x[1]["http.route"]) == [(4, {"http.route": "/x", "service.name": "s"}),
                                                                (2, {"http.route": "/y", "service.name": "s"})]
    assert b.adds == [(0.75, {"http.route": "/x"})]
    adds.flush()  # emptied by the flush
    assert len(a.adds) == 2 and len(b.adds) == 1


def test_batched_adds_by_one_more_label_sum_per_value():
    """add_each: a request's launches by kernel, under the request's labels."""
    c, adds = Counter(), BatchedAdds()
    base = (("http.route", "/x"),)
    adds.add_each(c, base, "gpu.kernel.name", {"k1": 3, "k2": 1})
    adds.add_each(c, base, "gpu.kernel.name", {"k1": 2})
    adds.add_each(c, (("http.route", "/y"),), "gpu.kernel.name", {"k1": 5})
    assert c.adds == []
    adds.flush()
    assert sorted(c.adds, key=lambda x: sorted(x[1].items())) == [
        (5, {"http.route": "/x", "gpu.kernel.name": "k1"}), (5, {"http.route": "/y", "gpu.kernel.name": "k1"}),
        (1, {"http.route": "/x", "gpu.kernel.name": "k2"})]
    adds.flush()
    assert len(c.adds) == 3


def test_batched_records_record_each_value_once_at_the_batch_end():
    class Histogram:
        def __init__(self):
            self.recorded = []

        def record_all(self, values, attributes):
            self.recorded.append((list(values), attributes))

    h, records = Histogram(), BatchedRecords()
    for v, route in ((0.1, "/x"), (0.2, "/y"), (0.3, "/x")):
        records.record(h, v, (("http.route", route),))
    assert h.recorded == []  # nothing before the batch ends
    records.flush()
    assert sorted(h.recorded, key=lambda x: x[1]["http.route"]) == [([0.1, 0.3], {"http.route": "/x"}),
                                                                    ([0.2], {"http.route": "/y"})]
    records.flush()  # emptied by the flush
    assert len(h.recorded) == 2
