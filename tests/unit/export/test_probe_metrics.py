"""otel_gpu.probes.attached / otel_gpu.probes.failed: the attacher's counts by function
(ProbeCounts records, one per flush) through the real SDK MeterProvider. A function
that failed and then attached reports failed 0, not nothing; names that are not in the
probe table never become label values."""
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu.export.metrics import PROBE_FUNCTION, GpuMetrics
from otel_gpu.probes.attacher import ProbeCounts
from otel_gpu.ratelimit import Stats


def _points(reader, name):
    out = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    out.update({p.attributes[PROBE_FUNCTION]: p.value for p in m.data.data_points})
    return out


def test_probe_counts_by_function_follow_the_latest_record():
    reader = InMemoryMetricReader()
    gpu = GpuMetrics([reader], Stats())
    try:
        gpu.process([ProbeCounts({"cudaMemcpy": 2, "not_a_probe": 1}, {"cudaLaunchKernel": 1})])
        assert _points(reader, "otel_gpu.probes.failed") == {"cudaLaunchKernel": 1, "cudaMemcpy": 0}
        assert _points(reader, "otel_gpu.probes.attached") == {"cudaLaunchKernel": 0, "cudaMemcpy": 2}
        gpu.process([ProbeCounts({"cudaMemcpy": 2, "cudaLaunchKernel": 1}, {})])  # the retry attached it
        assert _points(reader, "otel_gpu.probes.failed") == {"cudaLaunchKernel": 0, "cudaMemcpy": 0}
        assert _points(reader, "otel_gpu.probes.attached") == {"cudaLaunchKernel": 1, "cudaMemcpy": 2}
    finally:
        gpu.shutdown()
