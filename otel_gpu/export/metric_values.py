"""Metric values that always encode. OTLP integer points are int64: one absurd value
(a traced process's cudaMemcpy of 2^64-1 bytes) in a cumulative counter would make
every later export of it fail. So:

- each call adds at most MAX_CALL_BYTES to a byte counter (clamp_call_bytes);
- a counter's series never sums past INT64_MAX (CappedCounter): the rest is refused;
- the OTLP exporter is wrapped (GuardedExporter): any int point still outside int64 is
  clamped before encoding, and an export that raises or fails is counted and logged
  (rate-limited), never a traceback, never a wedge.
Every clamp is counted as metric_values_clamped."""
from __future__ import annotations

import dataclasses
import logging
import threading

from opentelemetry.sdk.metrics.export import MetricExporter, MetricExportResult

from ..ratelimit import RateLimitedLog, Stats

log = logging.getLogger(__name__)
INT64_MAX = 2**63 - 1
INT64_MIN = -2**63
# No single CUDA call moves 1 TiB (a GPU holds at most a few hundred GiB): a larger
# count is not a real copy and is clamped to this in byte counters.
MAX_CALL_BYTES = 2**40
CLAMPED = "metric_values_clamped"


def clamp_call_bytes(n: int, stats: Stats, calls: int = 1) -> int:
    """`n` bytes moved by `calls` calls, at most MAX_CALL_BYTES each."""
    most = MAX_CALL_BYTES * max(calls, 1)
    if n > most:
        stats.add(CLAMPED)
        return most
    return n


class CappedCounter:
    """An SDK int counter whose every series stays within int64."""

    def __init__(self, counter, stats: Stats) -> None:
        self.counter, self.stats = counter, stats
        self._totals: dict[frozenset, int] = {}
        self._lock = threading.Lock()

    def add(self, n: int, attributes: dict) -> None:
        key = frozenset(attributes.items())
        with self._lock:
            total = self._totals.get(key, 0)
            if total + n > INT64_MAX:
                n = INT64_MAX - total
                self.stats.add(CLAMPED)
            self._totals[key] = total + n
        if n > 0:
            self.counter.add(n, attributes)


class BatchedAdds:
    """A pipeline batch's counter adds, summed per (counter, attributes) and made at its
    end: one SDK add per series and batch instead of one per request (each SDK add hashes
    its attributes under a lock: ~8 % of the collector's CPU at 2,000 requests/s).
    Attributes come as a tuple of (key, value) pairs: a request's labels are built as
    tuples, and made a dict once per series and batch."""

    def __init__(self) -> None:
        self._sums: dict = {}
        self._each: dict = {}  # (counter, base, label) -> label value -> n

    def add(self, counter, n, attributes: tuple) -> None:
        key = (counter, attributes)
        self._sums[key] = self._sums.get(key, 0) + n

    def add_each(self, counter, base: tuple, label: str, counts: dict) -> None:
        """add(counter, n, base + ((label, value),)) for each value -> n of `counts`, with
        `base` hashed once: a request's kernels, dozens of series under its labels."""
        per = self._each.get((counter, base, label))
        if per is None:
            per = self._each[(counter, base, label)] = {}
        for value, n in counts.items():
            per[value] = per.get(value, 0) + n

    def flush(self) -> None:
        sums, self._sums = self._sums, {}
        each, self._each = self._each, {}
        for (counter, attributes), n in sums.items():
            counter.add(n, dict(attributes))
        for (counter, base, label), per in each.items():
            for value, n in per.items():
                counter.add(n, dict(base + ((label, value),)))


class BatchedRecords:
    """The same for histogram values (export/histograms.py): kept per (histogram,
    attributes) in the batch, recorded at its end with one key and one lock per series."""

    def __init__(self) -> None:
        self._values: dict = {}

    def record(self, histogram, value: float, attributes: tuple) -> None:
        values = self._values.get((histogram, attributes))
        if values is None:
            self._values[(histogram, attributes)] = [value]
        else:
            values.append(value)

    def flush(self) -> None:
        batch, self._values = self._values, {}
        for (histogram, attributes), values in batch.items():
            histogram.record_all(values, dict(attributes))


def _clamped(point, stats: Stats):
    """The point with int fields outside int64 clamped, or the point itself."""
    changes = {}
    for name in ("value", "sum", "min", "max"):
        v = getattr(point, name, None)
        if type(v) is int and not INT64_MIN <= v <= INT64_MAX:
            changes[name] = max(INT64_MIN, min(INT64_MAX, v))
    if not changes:
        return point
    stats.add(CLAMPED)
    return dataclasses.replace(point, **changes)


def encodable(data, stats: Stats):
    """MetricsData whose int points all fit int64 (a copy only when one did not)."""
    rms = []
    changed = False
    for rm in data.resource_metrics:
        sms = []
        for sm in rm.scope_metrics:
            metrics = []
            for m in sm.metrics:
                points = getattr(m.data, "data_points", None)
                if points:
                    new = [_clamped(p, stats) for p in points]
                    if any(a is not b for a, b in zip(new, points)):
                        m = dataclasses.replace(m, data=dataclasses.replace(m.data, data_points=new))
                        changed = True
                metrics.append(m)
            sms.append(dataclasses.replace(sm, metrics=metrics))
        rms.append(dataclasses.replace(rm, scope_metrics=sms))
    return dataclasses.replace(data, resource_metrics=rms) if changed else data


class GuardedExporter(MetricExporter):
    """Wraps a metric exporter: values made encodable, failures counted
    (metrics_export_failed) and logged at most once a minute."""

    def __init__(self, inner: MetricExporter, stats: Stats) -> None:
        super().__init__(preferred_temporality=inner._preferred_temporality,
                         preferred_aggregation=inner._preferred_aggregation)
        self.inner, self.stats = inner, stats
        self._log = RateLimitedLog(log, stats)

    def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs) -> MetricExportResult:
        try:
            result = self.inner.export(encodable(metrics_data, self.stats), timeout_millis=timeout_millis,
                                       **kwargs)
        except Exception as e:  # an exporter bug must not stop the next export
            self._log.event("metrics_export_failed", logging.WARNING, "metrics export failed: %s: %s",
                            type(e).__name__, e)
            return MetricExportResult.FAILURE
        if result is not MetricExportResult.SUCCESS:
            self._log.event("metrics_export_failed", logging.WARNING,
                            "metrics export failed (the backend refused or did not answer)")
        return result

    def force_flush(self, timeout_millis: float = 10_000) -> bool:
        return self.inner.force_flush(timeout_millis=timeout_millis)

    def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
        self.inner.shutdown(timeout_millis=timeout_millis, **kwargs)
