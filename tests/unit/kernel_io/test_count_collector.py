"""kernel_io/count_collector.py: req_agg's ended counts taken on a thread while the
pipeline works through a batch, never while the loop is back at the ring."""
from __future__ import annotations

import logging
import time

from otel_gpu.kernel_io.count_collector import CountCollector


class Aggregates:
    """AggregateReader's collect(): counts its calls; the first one fails."""

    def __init__(self) -> None:
        self.calls = 0

    def collect(self) -> None:
        self.calls += 1
        if self.calls == 1:
            raise OSError("map gone")


def test_it_collects_only_while_busy_and_a_failure_is_logged_not_its_end(caplog):
    aggregates = Aggregates()
    with caplog.at_level(logging.WARNING, logger="otel_gpu.kernel_io.count_collector"):
        collector = CountCollector(aggregates)
        time.sleep(0.2)
        assert aggregates.calls == 0  # idle: the loop's own merge reads the table
        collector.busy()
        deadline = time.monotonic() + 5
        while aggregates.calls < 2 and time.monotonic() < deadline:  # on after the failure
            time.sleep(0.01)
        collector.idle()
        time.sleep(0.1)  # a collect under way ends
        settled = aggregates.calls
        time.sleep(0.2)
        collector.close()
    assert settled >= 2 and aggregates.calls == settled
    assert [r.getMessage() for r in caplog.records] == [
        "req_agg: counts not collected (map gone); the next poll reads them"]
