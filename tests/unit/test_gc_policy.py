"""gc_policy: the collector's loop runs with its thresholds, and what start built is out of
the collector's walks (frozen)."""
import gc

import pytest

from otel_gpu import gc_policy


@pytest.fixture
def restored():
    before = gc.get_threshold()
    yield
    gc.unfreeze()
    gc.set_threshold(*before)


def test_the_loop_runs_with_its_thresholds_and_start_frozen(restored):
    gc.unfreeze()
    gc_policy.set_for_the_loop()
    assert gc.get_threshold() == gc_policy.THRESHOLDS
    assert gc.get_freeze_count() > 0
