"""The one place BPF time becomes wall-clock time.

bpf_ktime_get_ns() is CLOCK_MONOTONIC; spans need epoch nanoseconds. The offset is
sampled once at start (monotonic and realtime read back to back) and can be
re-sampled; NTP slews both clocks alike, so drift over a run is negligible."""
from __future__ import annotations

import time


class BpfClock:
    def __init__(self) -> None:
        self.offset_ns = 0
        self.resync()

    def resync(self) -> None:
        # Bracket the realtime read with two monotonic reads and take the midpoint.
        a = time.monotonic_ns()
        wall = time.time_ns()
        b = time.monotonic_ns()
        self.offset_ns = wall - (a + b) // 2

    def to_epoch_ns(self, monotonic_ns: int) -> int:
        return monotonic_ns + self.offset_ns
