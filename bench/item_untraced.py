"""Item 7: what the collector costs a process it does not trace. Its syscall
tracepoints (read/write/accept/... for HTTP) fire for every process on the host;
for an untraced one they should be one map lookup and out. bench/syscall_loop.c
runs small pipe and loopback-TCP round trips (4 syscalls each) with no collector,
with the collector in its default mode, and with no collector again (brackets
drift on a shared VM); the added time per syscall is (with - without) / 4."""
from __future__ import annotations

import statistics
import subprocess

from .collector import Collector
from .native import build

SYSCALLS_PER_ROUND_TRIP = 4
TARGET_NS = 100  # "one lookup and out": a tracepoint hit plus a hash miss


def _loop(mode: str, n: int, reps: int) -> float:
    """Median ns per round trip over the repetitions (the first is a warm-up)."""
    out = subprocess.run([str(build("syscall_loop")), mode, str(n), str(reps + 1)], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    times = [float(line.split()[2]) for line in out.splitlines() if line.startswith("rep ")]
    return statistics.median(times[1:])


def run(quick: bool, starts: list) -> dict:
    n = {"pipe": 100_000 if quick else 400_000, "tcp": 30_000 if quick else 120_000}
    reps = 5 if quick else 9
    out: dict = {}
    for mode in ("pipe", "tcp"):
        before = _loop(mode, n[mode], reps)
        col = Collector()
        starts.append(col.ready_s)
        try:
            traced = _loop(mode, n[mode], reps)
        finally:
            col.stop()
        after = _loop(mode, n[mode], reps)
        base = (before + after) / 2
        out[mode] = {"iterations": n[mode], "reps": reps, "untraced_ns": [before, after], "with_collector_ns": traced,
                     "added_ns_per_syscall": (traced - base) / SYSCALLS_PER_ROUND_TRIP}
    return out


def rows(r: dict) -> list:
    out = []
    for mode, what in (("pipe", "pipe read/write"), ("tcp", "loopback TCP read/write, accepted conn")):
        m = r[mode]
        added = m["added_ns_per_syscall"]
        out.append(("7", f"untraced process, {what}: ns per syscall added by the collector "
                         f"(round trip {m['untraced_ns'][0]:.0f}/{m['with_collector_ns']:.0f}/"
                         f"{m['untraced_ns'][1]:.0f} ns without/with/without)",
                    f"{added:+.0f}", f"<= {TARGET_NS}", added <= TARGET_NS))
    return out
