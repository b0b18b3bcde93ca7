"""Requests the kernel summarised (kernel_io/request_summaries.py): read as the
differences of the kernel's growing counts, and recorded into http.server.request.duration
through the wired pipeline, each at its kernel bucket's mean (count and sum exact, every
value in the histogram bucket its own duration would have taken)."""
from types import SimpleNamespace

from otel_gpu import semconv as sc
from otel_gpu.kernel_io.request_summaries import SummaryReader
from otel_gpu.probes.summary_buckets import BOUNDS_NS, HTTP_DURATION_BOUNDS_S
from otel_gpu.records import RequestSummary, Tick
from tests.unit.test_pipeline import PID, wired

BUCKETS = len(BOUNDS_NS) + 1


class Table:
    """req_summaries as bcc reads it: (key with .value, leaf with .count and .sum_ns)."""

    def __init__(self):
        self.rows = {}

    def set(self, tgid, counts, sums):
        self.rows[tgid] = SimpleNamespace(count=list(counts), sum_ns=list(sums))

    def items(self):
        return [(SimpleNamespace(value=t), v) for t, v in self.rows.items()]


def test_each_read_says_what_was_counted_since_the_last():
    table = Table()
    reader = SummaryReader(table)
    counts, sums = [0] * BUCKETS, [0] * BUCKETS
    counts[2], sums[2] = 3, 3 * 20_000_000
    table.set(PID, counts, sums)
    (first,) = reader.read()
    assert (first.tgid, first.buckets[2]) == (PID, (3, 60_000_000))
    assert reader.read() == []  # nothing new
    counts[2], sums[2] = 5, 5 * 20_000_000
    table.set(PID, counts, sums)
    (second,) = reader.read()
    assert second.buckets[2] == (2, 40_000_000) and sum(c for c, _ in second.buckets) == 2


def test_summarised_requests_count_in_the_request_metric_at_their_bucket_mean(tmp_path):
    w, _, reader = wired(tmp_path)
    buckets = [(0, 0)] * BUCKETS
    buckets[1] = (2, 7_000_000 + 9_000_000)        # (5 ms, 10 ms]
    buckets[BUCKETS - 1] = (1, 20_000_000_000_000)  # past the last bound
    w.pipeline.push([RequestSummary(PID, buckets), Tick(1_000, final=True)])
    (metric,) = [m for rm in reader.get_metrics_data().resource_metrics for sm in rm.scope_metrics
                 for m in sm.metrics if m.name == "http.server.request.duration"]
    (point,) = metric.data.data_points
    assert dict(point.attributes) == {sc.SERVICE_NAME: "svc", sc.GPU_REQUEST_SUMMARISED: True}
    assert list(point.explicit_bounds) == list(HTTP_DURATION_BOUNDS_S)  # the kernel's buckets
    assert point.count == 3 and abs(point.sum - (0.016 + 20_000)) < 1e-6
    assert point.bucket_counts[1] == 2  # (5 ms, 10 ms]: both, at their mean of 8 ms
    assert point.bucket_counts[-1] == 1
