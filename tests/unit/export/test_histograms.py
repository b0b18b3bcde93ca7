"""export/histograms.py against the SDK's own histogram: the same values and attribute
sets recorded into both, each through its own MeterProvider and reader, must export the
same points (boundaries, bucket counts, sum, count, min, max, attributes), for
cumulative and delta readers, across collections, and past the cardinality limit."""
import random

import pytest
from opentelemetry.sdk.metrics import Histogram as SdkHistogram
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import AggregationTemporality, InMemoryMetricReader
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from otel_gpu.export.histograms import Histograms

SCOPE = InstrumentationScope("otel-gpu", "1.0")
BOUNDS = [0.005, 0.01, 0.025, 0.05, 0.1, 0.25, 0.5, 1.0]
DELTA = {SdkHistogram: AggregationTemporality.DELTA}


class Pair:
    """One SDK histogram and one of ours, each on its own provider and reader."""

    def __init__(self, delta: bool = False, bounds=None) -> None:
        kw = {"preferred_temporality": DELTA} if delta else {}
        self.sdk_reader, self.our_reader = InMemoryMetricReader(**kw), InMemoryMetricReader(**kw)
        sdk_meter = MeterProvider(metric_readers=[self.sdk_reader]).get_meter(SCOPE.name, SCOPE.version)
        self.sdk = sdk_meter.create_histogram("h", "s", "d", explicit_bucket_boundaries_advisory=bounds)
        ours = Histograms(SCOPE)
        # The SDK receives a collection only if its instruments had something (histograms.py).
        MeterProvider(metric_readers=[self.our_reader]).get_meter(SCOPE.name, SCOPE.version).create_counter("c").add(1)
        ours.attach(self.our_reader)
        self.ours = ours.create("h", "s", "d", bounds) if bounds else ours.create("h", "s", "d")

    def record(self, value, attributes) -> None:
        self.sdk.record(value, attributes)
        self.ours.record(value, attributes)

    def collect(self) -> tuple:
        return _points(self.sdk_reader), _points(self.our_reader)


def _points(reader) -> dict:
    """attributes -> (count, sum, buckets, bounds, min, max) of histogram "h", and its temporality."""
    data = reader.get_metrics_data()
    out, temporality = {}, None
    for rm in data.resource_metrics if data else ():
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name != "h":
                    continue
                temporality = m.data.aggregation_temporality
                for p in m.data.data_points:
                    out[frozenset(p.attributes.items())] = (
                        p.count, round(p.sum, 9), tuple(p.bucket_counts), tuple(p.explicit_bounds), p.min, p.max)
    return {"points": out, "temporality": temporality}


def _values(rng, n):
    """Values on, between and beyond the boundaries, and zero."""
    return [rng.choice([0.0, 0.005, 0.0051, 0.3, 1.0, 7.5, rng.random(), rng.random() * 20]) for _ in range(n)]


@pytest.mark.parametrize("delta", [False, True])
@pytest.mark.parametrize("bounds", [BOUNDS, None])
def test_the_same_points_as_the_sdk_across_collections(delta, bounds):
    rng = random.Random(7)
    pair = Pair(delta, bounds)
    sets = [{"route": "/a", "code": 200}, {"route": "/b", "code": 500, "flag": True}, {}]
    for rounds in range(3):
        for v in _values(rng, 200):
            pair.record(v, rng.choice(sets[:2] if rounds == 1 else sets))  # round 1: the empty set has none
        sdk, ours = pair.collect()
        assert ours == sdk
        assert sdk["temporality"] is (AggregationTemporality.DELTA if delta else AggregationTemporality.CUMULATIVE)
    sdk, ours = pair.collect()  # nothing new: a delta reader gets no point, a cumulative one the same again
    assert ours == sdk and bool(ours["points"]) is not delta


@pytest.mark.parametrize("delta", [False, True])
def test_values_recorded_together_are_the_sdks_values_one_by_one(delta):
    """record_all (a batch's values of one attribute set: metric_values.BatchedRecords)."""
    rng = random.Random(11)
    pair = Pair(delta, BOUNDS)
    for rounds in range(2):
        for attributes in ({"route": "/a"}, {"route": "/b", "code": 500}):
            values = _values(rng, 50)
            for v in values:
                pair.sdk.record(v, attributes)
            pair.ours.record_all(values, attributes)
        sdk, ours = pair.collect()
        assert ours == sdk and len(ours["points"]) == 2


def test_a_delta_point_starts_at_the_previous_collection():
    pair = Pair(delta=True)
    pair.record(1.0, {"a": 1})
    first = pair.our_reader.get_metrics_data()
    pair.record(2.0, {"a": 1})
    pair.record(3.0, {"b": 2})  # a set first seen after a collection starts there too
    second = pair.our_reader.get_metrics_data()
    mine = lambda d: [p for rm in d.resource_metrics for sm in rm.scope_metrics for m in sm.metrics  # noqa: E731
                      if m.name == "h" for p in m.data.data_points]
    (p1,) = mine(first)
    assert p1.start_time_unix_nano <= p1.time_unix_nano
    assert {p.start_time_unix_nano for p in mine(second)} == {p1.time_unix_nano}


@pytest.mark.parametrize("delta", [False, True])
def test_past_the_cardinality_limit_values_go_to_the_overflow_series_as_in_the_sdk(delta):
    pair = Pair(delta)  # both sides at their own limit: ours must be the SDK's default, 2000
    for i in range(2100):
        pair.record(float(i % 7), {"i": i})
    sdk, ours = pair.collect()
    assert ours == sdk and len(ours["points"]) == 2001
    assert ours["points"][frozenset({"otel.metric.overflow": True}.items())][0] == 100
    for i in range(1990, 2010):  # cumulative: the sets kept stay, new ones overflow; delta: the limit is per interval
        pair.record(1.0, {"i": i})
    sdk, ours = pair.collect()
    assert ours == sdk


def test_the_readers_scope_keeps_the_sdks_own_metrics_and_each_reader_its_own_temporality():
    cumulative, delta = InMemoryMetricReader(), InMemoryMetricReader(preferred_temporality=DELTA)
    provider = MeterProvider(metric_readers=[cumulative, delta])
    meter = provider.get_meter(SCOPE.name, SCOPE.version)
    ours = Histograms(SCOPE)
    ours.attach(cumulative)
    ours.attach(delta)
    h = ours.create("h", "s", "d", BOUNDS)
    meter.create_counter("c").add(3)
    h.record(0.2, {})
    for reader in (cumulative, delta):
        (rm,) = reader.get_metrics_data().resource_metrics
        (sm,) = rm.scope_metrics
        assert sm.scope.name == SCOPE.name and sorted(m.name for m in sm.metrics) == ["c", "h"]
    h.record(0.3, {})
    assert _points(cumulative)["points"][frozenset()][0] == 2
    assert _points(delta)["points"][frozenset()][0] == 1
