"""A thread that takes req_agg's ended counts while the pipeline works through a batch
(kernel_io/reader.py AggregateReader.collect): the table then fills only with the counts
of that long, not with those of the collector's backlog. Idle (no batch), it sleeps."""
from __future__ import annotations

import logging
import threading

log = logging.getLogger(__name__)
COLLECT_EVERY_S = 0.05  # req_agg's ended counts taken this often while a batch is worked through


class CountCollector:
    """`busy()` when poll() hands the pipeline a batch, `idle()` when the loop is back at
    the ring (its merge reads the table itself), `close()` once."""

    def __init__(self, aggregates) -> None:
        self.aggregates = aggregates
        self._pushing, self._closing = threading.Event(), threading.Event()
        threading.Thread(target=self._run, name="req_agg", daemon=True).start()

    def busy(self) -> None:
        self._pushing.set()

    def idle(self) -> None:
        self._pushing.clear()

    def close(self) -> None:
        self._closing.set()
        self._pushing.set()  # wakes the thread to see it

    def _run(self) -> None:
        while self._pushing.wait() and not self._closing.wait(COLLECT_EVERY_S):
            if not self._pushing.is_set():
                continue  # the loop is back at the ring: its merge reads the table
            try:
                self.aggregates.collect()
            except Exception as e:  # never the thread's end: the next poll's merge reads the table all the same
                log.warning("req_agg: counts not collected (%s); the next poll reads them", e)
