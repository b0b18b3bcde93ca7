"""pipeline/model.py: the records the stitcher fills."""
import dataclasses

from otel_gpu.pipeline.model import CallSink, RollupAgg


def _every_field_set() -> RollupAgg:
    return RollupAgg(*range(1, len(dataclasses.fields(RollupAgg))), kernels=((0xF00, 2),))


def test_rollup_copy_has_every_field_and_is_its_own():
    """copy() names the fields one by one: a field added later must be in it."""
    agg = _every_field_set()
    twin = agg.copy()
    assert twin == agg and twin is not agg
    twin.count += 1
    assert agg.count == 3


def test_a_sink_keeps_its_own_rollup():
    """Merging into a sink copies the first rollup: later merges do not change the caller's."""
    sink, agg = CallSink(budget=0), _every_field_set()
    sink.add_rollup(agg, "thread")
    sink.add_rollup(agg, "thread")
    assert agg.count == 3 and sink.rollups[(agg.call, agg.detail)].count == 6


def test_a_sink_keeps_a_rollup_handed_over_and_merges_the_next():
    """A settled hold's folds are handed over (given): the first of a key is kept, not
    copied; a later one of the same key is added into it and stays the caller's."""
    sink, first, second = CallSink(budget=0), _every_field_set(), _every_field_set()
    sink.add_rollup(first, "thread", given=True)
    sink.add_rollup(second, "thread", given=True)
    assert sink.rollups[(first.call, first.detail)] is first and first.count == 6 and second.count == 3
