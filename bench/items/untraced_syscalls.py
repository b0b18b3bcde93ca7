"""Item 7: what the collector costs a process it does not trace. Its raw syscall
tracepoint (every syscall's exit, bpf/http_syscalls.c) and the open syscalls' fire for every
process on the host; for an untraced one they should be one inlined read and out.
bench/native/syscall_loop.c runs small pipe and loopback-TCP round trips (4 syscalls
each, timed in the loop's own CPU time) with no collector, with no-op programs where
the collector's are (the kernel's floor: bench/untraced_floor.py), with no-op programs
on every syscall's entry as well (the floor of the attach points before 2026-12-05), with
the collector in its default mode, and with nothing again (brackets drift on a shared VM);
the added time per syscall is (with - without) / 4. Our programs' own run time comes
from kernel.bpf_stats_enabled around a separate, untimed loop."""
from __future__ import annotations

import statistics
import subprocess

from otel_gpu.probes.rows import HTTP_RAW_TRACEPOINTS

from .. import bpfstats
from ..collector import Collector
from ..native import build
from ..untraced_floor import noop_programs

SYSCALLS_PER_ROUND_TRIP = 4
TARGET_NS = 100  # "one lookup and out": a tracepoint hit plus a hash miss
MODES = ("pipe", "tcp")
# bcc gives the kernel a raw tracepoint program's name without its raw_tracepoint__ prefix;
# the programs they tail-call count in their run time.
PROGRAM_NAMES = frozenset(tp.split(":")[1] for tp in HTTP_RAW_TRACEPOINTS)


def _loop(mode: str, n: int, reps: int) -> float:
    """Median ns per round trip over the repetitions (the first is a warm-up)."""
    out = subprocess.run([str(build("syscall_loop")), mode, str(n), str(reps + 1)], capture_output=True,
                         text=True, timeout=300, check=True).stdout
    times = [float(line.split()[2]) for line in out.splitlines() if line.startswith("rep ")]
    return statistics.median(times[1:])


def _program_ns(pid: int, n: int) -> dict:
    """Run time of the collector's syscall tracepoint programs per hit during an
    untraced pipe loop (each read/write is one hit, at its exit)."""
    with bpfstats.enabled():
        before = bpfstats.snapshot(pid)
        _loop("pipe", n, 1)
        after = bpfstats.snapshot(pid)
    runs = ns = 0
    for name, r, t in bpfstats.delta(before, after):
        if name in PROGRAM_NAMES:
            runs, ns = runs + r, ns + t
    return {"runs": runs, "ns": ns, "ns_per_hit": ns / runs if runs else None}


def run(quick: bool, starts: list) -> dict:
    n = {"pipe": 50_000 if quick else 200_000, "tcp": 15_000 if quick else 60_000}
    reps = 3 if quick else 7
    out: dict = {m: {"iterations": n[m], "reps": reps} for m in MODES}
    for m in MODES:
        out[m]["before_ns"] = _loop(m, n[m], reps)
    with noop_programs():
        for m in MODES:
            out[m]["noop_ns"] = _loop(m, n[m], reps)
    with noop_programs(entries=True):
        for m in MODES:
            out[m]["noop_entries_ns"] = _loop(m, n[m], reps)
    col = Collector()
    starts.append(col.ready_s)
    try:
        for m in MODES:
            out[m]["with_collector_ns"] = _loop(m, n[m], reps)
        out["programs"] = _program_ns(col.pid, n["pipe"] // 4)
    finally:
        col.stop()
    for m in MODES:
        r = out[m]
        r["after_ns"] = _loop(m, n[m], reps)
        base = (r["before_ns"] + r["after_ns"]) / 2
        r["added_ns_per_syscall"] = (r["with_collector_ns"] - base) / SYSCALLS_PER_ROUND_TRIP
        r["floor_ns_per_syscall"] = (r["noop_ns"] - base) / SYSCALLS_PER_ROUND_TRIP
        r["entries_floor_ns"] = (r["noop_entries_ns"] - base) / SYSCALLS_PER_ROUND_TRIP
    return out


def rows(r: dict) -> list:
    out = []
    for mode, what in (("pipe", "pipe read/write"), ("tcp", "loopback TCP read/write, accepted conn")):
        m = r[mode]
        added, floor = m["added_ns_per_syscall"], m["floor_ns_per_syscall"]
        out.append(("7", f"untraced process, {what}: ns per syscall added, collector vs no-op programs on "
                         f"the same tracepoints (round trip {m['before_ns']:.0f}/{m['noop_ns']:.0f}/"
                         f"{m['with_collector_ns']:.0f}/{m['after_ns']:.0f} ns CPU: none/no-op/collector/none)",
                    f"{added:+.0f} vs {floor:+.0f}", f"<= {TARGET_NS}", added <= TARGET_NS))
        if "entries_floor_ns" in m:
            out.append(("7", f"  no-op programs on every syscall's entry as well (the attach points before "
                             f"2026-12-05; round trip {m['noop_entries_ns']:.0f} ns)", f"{m['entries_floor_ns']:+.0f}",
                        "", None))
    p = r.get("programs") or {}
    if p.get("ns_per_hit") is not None:
        out.append(("7", f"  our syscall program's own run time per hit, untraced (bpf_stats, {p['runs']} hits; "
                         "a read or write is 1 hit, at its exit)", f"{p['ns_per_hit']:.0f} ns", "", None))
    return out
