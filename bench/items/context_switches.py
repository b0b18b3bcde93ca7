"""Item 17: what the time split's sched tracepoints (bpf/sched_probes.c) cost a context
switch. bench/native/switch_loop.c ping-pongs two threads on one CPU over pipes (two
switches and four pipe syscalls a round trip), untraced and traced (it loads
libcudart, so the collector keeps its threads' time), in interleaved rounds: with nothing
attached, with no-op programs on the same raw sched tracepoint (the kernel's floor), with the
collector as it runs by default (the split on), and with it run --no-time-split (its syscall
tracepoints alone: what the pipe syscalls pay). The time split's share per switch = (the
default round trip - the --no-time-split one) / 2. Our sched programs' own run time per
hit comes from kernel.bpf_stats_enabled over a separate traced loop. Then what a traced
service pays per request: the bench service's CPU per request under the collector with and
without the split, interleaved (_per_request)."""
from __future__ import annotations

import contextlib
import statistics
import subprocess

from otel_gpu.probes.rows import SCHED_TRACEPOINTS
from otel_gpu.probes.source import kernel_headers_hint

from .. import bpfstats
from tests.support.collector_process import cpu_seconds

from ..collector import Collector
from ..native import build, use_private_cudart
from ..target import Service

SWITCHES_PER_ROUND_TRIP = 2
PATH = "/launch/0"  # the bench service's HTTP path alone (bench/http_service.py)
TARGET_NS = 100  # issue 48: an untraced busy process's cost per context switch
# bcc gives the kernel a raw tracepoint program's name without its raw_tracepoint__ prefix,
# cut at 15 characters.
PROGRAM_NAMES = frozenset(tp.split(":")[1][:15] for tp in SCHED_TRACEPOINTS)


def _loop(n: int, reps: int, traced: bool) -> float:
    """Median ns per round trip over the repetitions (the first is a warm-up)."""
    argv = [str(build("switch_loop")), str(n), str(reps + 1)] + ([use_private_cudart()] if traced else [])
    out = subprocess.run(argv, capture_output=True, text=True, timeout=300, check=True).stdout
    times = [float(line.split()[2]) for line in out.splitlines() if line.startswith("rep ")]
    return statistics.median(times[1:])


@contextlib.contextmanager
def _noop():
    kernel_headers_hint()
    from bcc import BPF
    text = "\n".join(f"RAW_TRACEPOINT_PROBE({tp.split(':')[1]}) {{ return 0; }}" for tp in SCHED_TRACEPOINTS)
    bpf = BPF(text=text.encode())
    try:
        yield
    finally:
        bpf.cleanup()


def _program_ns(pid: int, n: int) -> dict:
    with bpfstats.enabled():
        before = bpfstats.snapshot(pid)
        _loop(n, 1, traced=True)
        after = bpfstats.snapshot(pid)
    runs = ns = 0
    for name, r, t in bpfstats.delta(before, after):
        if name in PROGRAM_NAMES:
            runs, ns = runs + r, ns + t
    return {"runs": runs, "ns": ns, "ns_per_hit": ns / runs if runs else None}


def run(quick: bool, starts: list) -> dict:
    n, reps, rounds = (20_000, 3, 2) if quick else (100_000, 5, 4)
    phases: dict = {k: [] for k in ("none", "noop", "split", "split_traced", "no_split", "no_split_traced")}
    programs = None
    for _ in range(rounds):
        phases["none"].append(_loop(n, reps, False))
        with _noop():
            phases["noop"].append(_loop(n, reps, False))
        for key, args in (("split", ()), ("no_split", ("--no-time-split",))):
            col = Collector(args=args)
            starts.append(col.ready_s)
            try:
                phases[key].append(_loop(n, reps, False))
                phases[f"{key}_traced"].append(_loop(n, reps, True))
                if programs is None and key == "split":
                    programs = _program_ns(col.pid, n // 4)
            finally:
                col.stop()
    out = {"iterations": n, "reps": reps, "rounds": rounds, "phases": phases, "programs": programs or {}}
    med = lambda k: statistics.median(phases[k])  # noqa: E731
    out["untraced_added_ns_per_switch"] = (med("split") - med("no_split")) / SWITCHES_PER_ROUND_TRIP
    out["traced_added_ns_per_switch"] = (med("split_traced") - med("no_split_traced")) / SWITCHES_PER_ROUND_TRIP
    out["floor_ns_per_switch"] = (med("noop") - med("none")) / SWITCHES_PER_ROUND_TRIP
    out["service"] = _per_request(2 if quick else 5, rounds, starts)
    return out


def _per_request(seconds: float, rounds: int, starts: list) -> dict:
    """The traced service's cost per request: the bench service (real libcudart, its HTTP
    path alone: GET /launch/0, one keep-alive connection) under the collector with the
    split and run --no-time-split, interleaved; its own CPU per request (utime + stime:
    the sched program and the snapshots run on its threads)."""
    phases: dict = {"split": [], "no_split": []}
    svc = Service()
    try:
        svc.load(1, conns=1, path=PATH)  # warm-up
        for _ in range(rounds):
            for key, args in (("split", ()), ("no_split", ("--no-time-split",))):
                col = Collector(args=args)
                starts.append(col.ready_s)
                try:
                    col.wait_traced(svc.pid)
                    svc.load(1, conns=1, path=PATH)
                    cpu0 = cpu_seconds(svc.pid)
                    n = max(svc.load(seconds, conns=1, path=PATH)["ok"], 1)
                    phases[key].append((cpu_seconds(svc.pid) - cpu0) / n * 1e6)
                finally:
                    col.stop()
    finally:
        svc.stop()
    added = statistics.median(phases["split"]) - statistics.median(phases["no_split"])
    return {"seconds": seconds, "path": PATH, "phases": phases, "added_us_per_request": added}


def rows(r: dict) -> list:
    ph = r["phases"]
    spread = lambda xs: f"{min(xs):.0f}-{max(xs):.0f}"  # noqa: E731
    untraced, floor = r["untraced_added_ns_per_switch"], r["floor_ns_per_switch"]
    out = [("17", f"untraced process, ns per context switch the time split adds (collector - collector "
                  f"--no-time-split) vs a no-op program on the sched tracepoint ({r['rounds']} interleaved rounds; "
                  f"round trip none {spread(ph['none'])}, no-op {spread(ph['noop'])}, collector "
                  f"{spread(ph['split'])}, --no-time-split {spread(ph['no_split'])} ns)",
            f"{untraced:+.0f} vs {floor:+.0f}", f"<= {TARGET_NS}", untraced <= TARGET_NS),
           ("17", f"traced process (its threads' time kept): ns per context switch the time split adds (round trip "
                  f"split on {spread(ph['split_traced'])}, off {spread(ph['no_split_traced'])} ns)",
            f"{r['traced_added_ns_per_switch']:+.0f}", "", None)]
    p = r.get("programs") or {}
    if p.get("ns_per_hit") is not None:
        out.append(("17", f"  our sched programs' own run time per hit, traced loop (bpf_stats, {p['runs']} hits; "
                          "a round trip is 2 switches, each a hit)", f"{p['ns_per_hit']:.0f} ns", "", None))
    s = r.get("service")
    if s:
        out.append(("17", f"traced service, its CPU per request the time split adds ({s['path']}, 1 connection, "
                          f"{r['rounds']} interleaved rounds of {s['seconds']} s; on "
                          f"{spread(s['phases']['split'])}, --no-time-split {spread(s['phases']['no_split'])} µs)",
                    f"{s['added_us_per_request']:+.1f} µs", "", None))
    return out
