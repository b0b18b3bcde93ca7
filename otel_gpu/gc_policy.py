"""The interpreter's cyclic garbage collector, set for the collector's loop.

CPython collects its youngest generation every 700 allocations, the middle one every 10 of
those, and the whole heap every 10 of these (once a quarter of it is new), each walking
every object of its generations. The pipeline keeps a batch's records, its open requests
and their calls alive while it works, and behind a load a batch holds ~1,700 requests: the
garbage collector walked them again and again, and found almost nothing (356 unreachable
objects after 20,000 requests through every stage). `bench.pipeline_speed`, batches of
1,700 requests: 118.7 µs a request at 10 % with CPython's thresholds, 102.3 with these
(131.1 against 159.6 at 100 %); batches of 16: the same (99.1 / 99.4). With these, a young
collection comes every 50,000 allocations, a full one at most every 10,000,000: garbage in
reference cycles waits longer (the pipeline makes almost none, above); everything else is
freed by its reference count as before."""
from __future__ import annotations

import gc

# Allocations between young collections; young collections per middle one; middle ones per
# full one (CPython: 700, 10, 10).
THRESHOLDS = (50_000, 20, 10)


def set_for_the_loop() -> None:
    """After start: what it built (the BPF program's tables, the pipeline, the exporters, the
    modules) is left out of every later walk, then the thresholds are set."""
    gc.collect()
    gc.freeze()
    gc.set_threshold(*THRESHOLDS)
