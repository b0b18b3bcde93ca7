"""Item 1: host time added per probed cudaLaunchKernel. The same C loop (real
libcudart), interleaved in one window: rounds of three fresh processes (untraced,
traced by otel-gpu outside any request, traced by bpftrace counting the same
function) in a rotating order, each on a private copy of libcudart, so a tracer's
uprobes fire only in its own processes. Then, with the same tracers, one loop inside
an open HTTP request (ring-buffer path) and the BPF programs' own run time."""
from __future__ import annotations

import contextlib
import statistics
import subprocess
import time

from otel_gpu.demo.cuda_work import find_cudart
from otel_gpu.demo.runner import interrupt_until

from .. import bpfstats
from ..collector import Collector
from ..machine import foreign_tracers
from ..native import BUILD, WARMUP_LAUNCHES, LaunchLoop, build, private_copy

VARIANTS = ("untraced", "otel", "bpftrace", "empty")  # empty: the uprobe trap with an empty program
OTEL_EXE = "ab_otel_loop"  # the collector's --exe: only these processes are traced (comm: 15 chars)


def _files() -> dict:
    """variant -> (launch_loop binary, libcudart): three copies of the library (one inode
    each: uprobes attach per file), and for otel a binary of its own name."""
    ab, loop, cudart = BUILD / "ab", build(), find_cudart()
    out = {v: (str(loop), private_copy(cudart, ab / v / "libcudart.so.12")) for v in VARIANTS}
    out["otel"] = (private_copy(loop, ab / OTEL_EXE), out["otel"][1])
    return out


def _loop(iters: int, reps: int, http: bool = False, before_go=None, files: tuple = (None, None)) -> dict:
    loop = LaunchLoop("--iters", str(iters), "--reps", str(reps), http=http, binary=files[0], cudart=files[1])
    if before_go:
        before_go(loop.pid)
    loop.go()
    res = loop.result()
    res["median_ns"] = statistics.median(res["cpu_reps"])  # thread CPU: robust to preemption
    res["median_wall_ns"] = statistics.median(res["reps"])
    res["foreign_tracers"] = foreign_tracers()
    return res


def _bpf_time(tracer_pid: int, iters: int, http: bool = False, before_go=None, files: tuple = (None, None)) -> dict:
    """One more (untimed) loop with kernel BPF stats on: the tracer's programs'
    own run time per launch, apart from the uprobe trap around them."""
    with bpfstats.enabled():
        before = bpfstats.snapshot(tracer_pid)
        _loop(iters, 1, http, before_go, files)
        ran = bpfstats.delta(before, bpfstats.snapshot(tracer_pid))
    launch = min(ran, key=lambda r: abs(r[1] - iters), default=("?", 0, 0))
    return {"programs": ran[:6], "launch_prog": launch[0], "launch_prog_runs": launch[1],
            "launch_prog_ns": launch[2] / max(launch[1], 1)}


@contextlib.contextmanager
def bpftrace_on(library: str, action: str = "@n = count();", probe: str = "cudaLaunchKernel"):
    """bpftrace running `action` on `probe` in `library` (by path: its processes only)
    while the block runs; yields {'pid'}, then holds its final count in ['counted']."""
    prog = "uprobe:%s:%s { %s }" % (library, probe, action)
    bt = subprocess.Popen(["bpftrace", "-e", prog], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    state = {"pid": bt.pid, "counted": None}
    try:
        if "Attaching" not in bt.stdout.readline():
            raise RuntimeError("bpftrace did not attach")
        time.sleep(1.0)  # "Attaching" is printed just before the attach itself
        yield state
    finally:
        out = _stopped(bt)
        counted = [int(l.split()[-1]) for l in out.splitlines() if l.startswith("@n:")]
        state["counted"] = counted[0] if counted else None


def _stopped(bt: subprocess.Popen) -> str:
    """bpftrace's output once SIGINT ended it; one that never ends is killed, and its
    count is then unknown."""
    out = []

    def ended(wait_s: float) -> bool:
        try:
            out.append(bt.communicate(timeout=wait_s)[0])  # a retry after a timeout loses nothing
            return True
        except subprocess.TimeoutExpired:
            return False

    if interrupt_until(bt, ended):
        return out[0]
    bt.kill()
    bt.communicate()
    return ""


def _rounds(n: int, iters: int, files: dict, col: Collector, deadline: float) -> list:
    """Up to n rounds (none started past the deadline): one fresh process per variant,
    one rep each, in an order that rotates by one variant per round."""
    out = []
    for i in range(n):
        if time.monotonic() > deadline:
            break
        k = i % len(VARIANTS)
        order = VARIANTS[k:] + VARIANTS[:k]
        rnd = {"order": order}
        for v in order:
            res = _loop(iters, 1, before_go=col.wait_traced if v == "otel" else None, files=files[v])
            rnd[v] = {"cpu": res["cpu_reps"][0], "wall": res["reps"][0], "launched": res["launched"],
                      "foreign_tracers": res["foreign_tracers"]}
        out.append(rnd)
    return out


def _variant(rounds: list, v: str) -> dict:
    cpu, wall = [r[v]["cpu"] for r in rounds], [r[v]["wall"] for r in rounds]
    return {"cpu_reps": cpu, "reps": wall, "median_ns": statistics.median(cpu),
            "median_wall_ns": statistics.median(wall), "launched": sum(r[v]["launched"] for r in rounds)}


def run(quick: bool, starts: list) -> dict:
    n_rounds, iters, budget_s = (5, 200_000, 120) if quick else (11, 1_000_000, 300)
    in_iters, in_reps = (100_000, 3) if quick else (200_000, 5)  # every launch is a ring-buffer event
    files = _files()
    out = {"iters": iters, "design": "interleaved rounds", "files": files}
    col = Collector(args=("--exe", OTEL_EXE))
    starts.append(col.ready_s)
    try:
        with bpftrace_on(files["bpftrace"][1]) as bt, bpftrace_on(files["empty"][1], action=""):
            rounds = _rounds(n_rounds, iters, files, col, time.monotonic() + budget_s)
            out["rounds"] = rounds
            cpu0 = col.cpu_seconds()
            out["otel_inside"] = _loop(in_iters, in_reps, http=True, before_go=col.wait_traced, files=files["otel"])
            out["otel_inside"]["collector_cpu_s"] = col.cpu_seconds() - cpu0
            bpf = {"otel_outside": _bpf_time(col.pid, iters, before_go=col.wait_traced, files=files["otel"]),
                   "otel_inside": _bpf_time(col.pid, in_iters, True, col.wait_traced, files["otel"]),
                   "bpftrace": _bpf_time(bt["pid"], iters, files=files["bpftrace"])}
    finally:
        out["collector"] = col.stop()
    out["untraced"] = _variant(rounds, "untraced")
    out["otel_outside"] = _variant(rounds, "otel")
    out["bpftrace"] = _variant(rounds, "bpftrace")
    out["empty"] = _variant(rounds, "empty")
    base, base_wall = out["untraced"]["median_ns"], out["untraced"]["median_wall_ns"]
    out["base_ns"], out["base_wall_ns"] = base, base_wall
    out["empty"]["added_ns"] = out["empty"]["median_ns"] - base
    out["empty"]["added_wall_ns"] = out["empty"]["median_wall_ns"] - base_wall
    for k in ("otel_outside", "otel_inside", "bpftrace"):
        out[k]["added_ns"] = out[k]["median_ns"] - base
        out[k]["added_wall_ns"] = out[k]["median_wall_ns"] - base_wall
        out[k]["bpf"] = bpf[k]
    # Paired: the same round's otel and bpftrace processes, seconds apart.
    out["paired_ns"] = statistics.median(r["otel"]["cpu"] - r["bpftrace"]["cpu"] for r in rounds)
    out["paired_wall_ns"] = statistics.median(r["otel"]["wall"] - r["bpftrace"]["wall"] for r in rounds)
    c = out["collector"]
    inside_launched = in_iters * (in_reps + 1)  # + the stats loop
    i = out["otel_inside"]
    i["launched"], i["counted"] = inside_launched, c.get("thread", 0) + c.get("process", 0)
    i["lost"] = inside_launched - i["counted"]
    o = out["otel_outside"]
    o["expected_outside"] = o["launched"] + iters  # + the stats loop; warm-ups run before the attach
    o["counted_outside"] = c.get("outside")
    b = out["bpftrace"]
    b["expected"] = b["launched"] + iters + (len(rounds) + 1) * WARMUP_LAUNCHES  # attached by path before start
    b["counted"] = bt["counted"]
    return out


def inside_ratio(r: dict) -> float:
    """What a launch inside a request adds, in units of the bare uprobe trap's cost."""
    return r["otel_inside"]["added_ns"] / r["empty"]["added_ns"]


def rows(r: dict) -> list:
    o, i, b = r["otel_outside"], r["otel_inside"], r["bpftrace"]
    n = len(r["rounds"])
    below = sum(x["otel"]["cpu"] < x["bpftrace"]["cpu"] for x in r["rounds"])
    cell = lambda x: f"+{x['added_ns']:.0f} (+{x['added_wall_ns']:.0f})"
    return [
        ("1", "untraced ns/launch: thread CPU (wall), median of reps", f"{r['base_ns']:.1f} ({r['base_wall_ns']:.1f})",
         "", None),
        ("1", "otel-gpu outside a request: added ns/launch CPU (wall)", cell(o), "<= 600", o["added_ns"] <= 600),
        ("1", "bpftrace count(): added ns/launch CPU (wall)", cell(b), "", None),
        ("1", "  the uprobe trap alone (bpftrace, empty program): added ns/launch CPU (wall)", cell(r["empty"]), "",
         None),
        ("1", f"otel-gpu - bpftrace count(), median of per-round differences (ns/launch), {n} rounds",
         f"{r['paired_ns']:+.0f} ({r['paired_wall_ns']:+.0f}); otel-gpu cheaper in {below} of {n}", "<= 0",
         r["paired_ns"] <= 0),
        ("1", "  isolation: otel-gpu 'outside' calls counted / its processes' launches",
         f"{o['counted_outside']} / {o['expected_outside']}", "equal", o["counted_outside"] == o["expected_outside"]),
        ("1", "  isolation: bpftrace @n / its processes' launches",
         f"{b['counted']} / {b['expected']}", "equal", b["counted"] == b["expected"]),
        ("1", "otel-gpu inside a request: added ns/launch CPU (wall)", cell(i), "<= 600", i["added_ns"] <= 600),
        ("1", "  inside / the trap alone (#26 item 7)", f"{inside_ratio(r):.2f}x", "<= 1.2x", inside_ratio(r) <= 1.2),
        ("1", "  inside: events lost / launched", f"{i['lost']} / {i['launched']}", "0", i["lost"] == 0),
        ("1", "BPF program run time per launch: outside / inside / bpftrace (ns)",
         f"{o['bpf']['launch_prog_ns']:.0f} / {i['bpf']['launch_prog_ns']:.0f} / {b['bpf']['launch_prog_ns']:.0f}",
         "", None),
    ]
