"""Explicit-bucket histograms that cost ~2 µs a value instead of the SDK's ~20: the SDK
builds a Measurement, cleans and hashes its attributes and matches views for every value
and reader, and GpuMetrics records several values per request (its duration, each copy's
bytes, sampled launch dims). The points go out through the SDK's own metric readers
(OTLP, Prometheus, in-memory), beside the SDK's instruments, as the SDK's histogram of the
same name would export them: the same boundaries, bucket counts, sum, min and max, each
reader's temporality, and the SDK's cardinality limit with its overflow series.
tests/unit/export/test_histograms.py holds them against the SDK's, value for value."""
from __future__ import annotations

import dataclasses
import math
import threading
import time
from bisect import bisect_left
from typing import Optional, Sequence

from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics.export import (AggregationTemporality, Histogram, HistogramDataPoint, Metric,
                                              MetricsData, ScopeMetrics)
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

# The SDK's defaults: boundaries without an advisory, and attribute sets kept per instrument
# (past it, values go to one series marked otel.metric.overflow=true).
DEFAULT_BOUNDARIES = (0.0, 5.0, 10.0, 25.0, 50.0, 75.0, 100.0, 250.0, 500.0, 750.0, 1000.0, 2500.0, 5000.0,
                      7500.0, 10000.0)
CARDINALITY_LIMIT = 2000
OVERFLOW = {"otel.metric.overflow": True}
_OVERFLOW_KEY = frozenset(OVERFLOW.items())


class _Point:
    """Values of one attribute set since a reader's last collection (or, for a cumulative
    reader, since the first)."""
    __slots__ = ("attributes", "counts", "sum", "min", "max", "start_ns")

    def __init__(self, attributes: dict, buckets: int, start_ns: int) -> None:
        self.attributes = attributes
        self.counts = [0] * buckets
        self.sum = 0.0
        self.min, self.max = math.inf, -math.inf
        self.start_ns = start_ns

    def fold(self, other: "_Point") -> None:
        self.counts = [a + b for a, b in zip(self.counts, other.counts)]
        self.sum += other.sum
        self.min, self.max = min(self.min, other.min), max(self.max, other.max)


class _ReaderView:
    """What one reader has of a histogram. As the SDK: a cumulative reader keeps every
    attribute set, each point starting at its first value; a delta reader starts afresh
    at each collection (its points start at the previous one, and the cardinality limit
    counts the sets of one interval)."""
    __slots__ = ("delta", "open", "totals", "known", "collected_ns")

    def __init__(self, delta: bool) -> None:
        self.delta = delta
        self.open: dict[frozenset, _Point] = {}    # since the last collection
        self.totals: dict[frozenset, _Point] = {}  # cumulative: since the first value
        self.known: set[frozenset] = set()          # attribute sets counted against the limit
        self.collected_ns: Optional[int] = None


class FastHistogram:
    def __init__(self, owner: "Histograms", name: str, unit: str, description: str,
                 boundaries: Sequence[float]) -> None:
        self.name, self.unit, self.description = name, unit, description
        self.boundaries = tuple(float(b) for b in boundaries)
        self._lock = owner.lock
        self._views: list[_ReaderView] = []  # one per attached reader, in attach order

    def record(self, value: float, attributes: dict) -> None:
        self.record_all((value,), attributes)

    def record_all(self, values, attributes: dict) -> None:
        """Values of one attribute set: one key and one lock for all of them."""
        key = frozenset(attributes.items())
        buckets = [bisect_left(self.boundaries, v) for v in values]
        with self._lock:
            for view in self._views:
                p = view.open.get(key)
                if p is None:
                    p = self._new_point(view, key, attributes)
                counts = p.counts
                for value, bucket in zip(values, buckets):
                    counts[bucket] += 1
                    p.sum += value
                    if value < p.min:
                        p.min = value
                    if value > p.max:
                        p.max = value

    def _new_point(self, view: _ReaderView, key: frozenset, attributes: dict) -> _Point:
        if key not in view.known:
            if len(view.known) >= CARDINALITY_LIMIT:  # the overflow series comes in addition
                key, attributes = _OVERFLOW_KEY, OVERFLOW
                if key in view.open:
                    return view.open[key]
            view.known.add(key)
        start = view.collected_ns if view.delta and view.collected_ns else time.time_ns()
        p = view.open[key] = _Point(dict(attributes), len(self.boundaries) + 1, start)
        return p

    def collect(self, reader: int, now_ns: int) -> Optional[Metric]:
        view = self._views[reader]
        with self._lock:
            taken, view.open, view.collected_ns = view.open, {}, now_ns
            if view.delta:
                view.known = set()
            else:
                for key, p in taken.items():
                    if key in view.totals:
                        view.totals[key].fold(p)
                    else:
                        view.totals[key] = p
                taken = view.totals
            points = [HistogramDataPoint(
                attributes=p.attributes, start_time_unix_nano=p.start_ns, time_unix_nano=now_ns,
                count=sum(p.counts), sum=p.sum, bucket_counts=tuple(p.counts), explicit_bounds=self.boundaries,
                min=p.min, max=p.max, exemplars=[]) for p in taken.values()]
        if not points:
            return None
        temporality = AggregationTemporality.DELTA if view.delta else AggregationTemporality.CUMULATIVE
        return Metric(name=self.name, description=self.description, unit=self.unit,
                      data=Histogram(data_points=points, aggregation_temporality=temporality))


class Histograms:
    """The fast histograms of one meter scope, merged into what each attached reader
    collects: the SDK calls a reader's _receive_metrics with the MetricsData of every
    collection (its periodic export, a Prometheus scrape, an in-memory read). A collection
    in which the SDK's instruments had nothing at all is not received: the values wait for
    the next (GpuMetrics' observable counters report at every collection)."""

    def __init__(self, scope: InstrumentationScope) -> None:
        self.scope = scope
        self.lock = threading.Lock()
        self._histograms: list[FastHistogram] = []
        self._deltas: list[bool] = []  # per attached reader: does it ask histograms for delta?

    def create(self, name: str, unit: str, description: str,
               boundaries: Sequence[float] = DEFAULT_BOUNDARIES) -> FastHistogram:
        h = FastHistogram(self, name, unit, description, boundaries)
        h._views = [_ReaderView(delta) for delta in self._deltas]
        self._histograms.append(h)
        return h

    def attach(self, reader) -> None:
        """Before any value is recorded: `reader` exports these histograms from now on."""
        index = len(self._deltas)
        delta = _histogram_temporality(reader) is AggregationTemporality.DELTA
        self._deltas.append(delta)
        for h in self._histograms:
            h._views.append(_ReaderView(delta))
        receive = reader._receive_metrics

        def receive_with_histograms(metrics_data, *args, **kwargs):
            if metrics_data.resource_metrics:  # else nothing to join: the values wait for the next
                now = time.time_ns()
                mine = [m for m in (h.collect(index, now) for h in self._histograms) if m is not None]
                metrics_data = self._merged(metrics_data, mine)
            return receive(metrics_data, *args, **kwargs)

        reader._receive_metrics = receive_with_histograms

    def _merged(self, data: MetricsData, mine: list) -> MetricsData:
        """`data` with `mine` in this scope's ScopeMetrics (made if the SDK had none)."""
        if not mine:
            return data
        first, *others = data.resource_metrics
        scopes = list(first.scope_metrics)
        at = next((i for i, s in enumerate(scopes)
                   if (s.scope.name, s.scope.version) == (self.scope.name, self.scope.version)), None)
        if at is None:
            scopes.append(ScopeMetrics(scope=self.scope, metrics=mine, schema_url=self.scope.schema_url or ""))
        else:
            scopes[at] = dataclasses.replace(scopes[at], metrics=list(scopes[at].metrics) + mine)
        return dataclasses.replace(data, resource_metrics=[dataclasses.replace(first, scope_metrics=scopes), *others])


def _histogram_temporality(reader) -> AggregationTemporality:
    """The temporality the reader asks of histograms (its exporter's preference: e.g.
    OTEL_EXPORTER_OTLP_METRICS_TEMPORALITY_PREFERENCE), cumulative by default."""
    chosen = getattr(reader, "_instrument_class_temporality", {})
    return next((t for cls, t in chosen.items() if issubclass(cls, SdkHistogram)), AggregationTemporality.CUMULATIVE)
