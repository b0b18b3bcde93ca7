"""Item 1: host time added per probed cudaLaunchKernel. The same C loop (real
libcudart), side by side: untraced, traced by otel-gpu outside any request (the
BPF-map rollup path), traced inside an open HTTP request (ring-buffer path), and
traced by bpftrace counting the same function."""
from __future__ import annotations

import signal
import statistics
import subprocess
import time

from otel_gpu.demo.cuda_work import find_cudart

from . import bpfstats
from .collector import Collector
from .machine import foreign_tracers
from .native import LaunchLoop


def _loop(iters: int, reps: int, http: bool = False, before_go=None) -> dict:
    loop = LaunchLoop("--iters", str(iters), "--reps", str(reps), http=http)
    if before_go:
        before_go(loop.pid)
    loop.go()
    res = loop.result()
    res["median_ns"] = statistics.median(res["cpu_reps"])  # thread CPU: robust to preemption
    res["median_wall_ns"] = statistics.median(res["reps"])
    res["foreign_tracers"] = foreign_tracers()
    return res


def _bpf_time(tracer_pid: int, iters: int, http: bool = False, before_go=None) -> dict:
    """One more (untimed) loop with kernel BPF stats on: the tracer's programs'
    own run time per launch, apart from the uprobe trap around them."""
    with bpfstats.enabled():
        before = bpfstats.snapshot(tracer_pid)
        _loop(iters, 1, http, before_go)
        ran = bpfstats.delta(before, bpfstats.snapshot(tracer_pid))
    launch = min(ran, key=lambda r: abs(r[1] - iters), default=("?", 0, 0))
    return {"programs": ran[:6], "launch_prog": launch[0], "launch_prog_runs": launch[1],
            "launch_prog_ns": launch[2] / max(launch[1], 1)}


def _bpftrace(iters: int, reps: int) -> dict:
    prog = "uprobe:%s:cudaLaunchKernel { @n = count(); }" % find_cudart()
    bt = subprocess.Popen(["bpftrace", "-e", prog], stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True)
    try:
        if "Attaching" not in bt.stdout.readline():
            raise RuntimeError("bpftrace did not attach")
        time.sleep(1.0)  # "Attaching" is printed just before the attach itself
        res = _loop(iters, reps)
        res["bpf"] = _bpf_time(bt.pid, iters)
    finally:
        bt.send_signal(signal.SIGINT)
        out, _ = bt.communicate(timeout=30)
    counted = [int(l.split()[-1]) for l in out.splitlines() if l.startswith("@n:")]
    res["counted"] = counted[0] if counted else None
    return res


def run(quick: bool, starts: list) -> dict:
    iters, reps = (200_000, 5) if quick else (1_000_000, 7)
    in_iters, in_reps = (100_000, 3) if quick else (200_000, 5)  # every launch is a ring-buffer event
    out = {"iters": iters, "reps": reps}
    out["untraced"] = _loop(iters, reps)
    col = Collector()
    starts.append(col.ready_s)
    try:
        out["otel_outside"] = _loop(iters, reps, before_go=col.wait_traced)
        cpu0 = col.cpu_seconds()
        out["otel_inside"] = _loop(in_iters, in_reps, http=True, before_go=col.wait_traced)
        out["otel_inside"]["collector_cpu_s"] = col.cpu_seconds() - cpu0
        out["otel_outside"]["bpf"] = _bpf_time(col.pid, iters, before_go=col.wait_traced)
        out["otel_inside"]["bpf"] = _bpf_time(col.pid, in_iters, True, col.wait_traced)
    finally:
        out["collector"] = col.stop()
    out["bpftrace"] = _bpftrace(iters, reps)
    out["untraced_after"] = _loop(iters, reps)
    base = statistics.median(out["untraced"]["cpu_reps"] + out["untraced_after"]["cpu_reps"])
    base_wall = statistics.median(out["untraced"]["reps"] + out["untraced_after"]["reps"])
    out["base_ns"], out["base_wall_ns"] = base, base_wall
    for k in ("otel_outside", "otel_inside", "bpftrace"):
        out[k]["added_ns"] = out[k]["median_ns"] - base
        out[k]["added_wall_ns"] = out[k]["median_wall_ns"] - base_wall
    c = out["collector"]
    inside_launched = in_iters * (in_reps + 1)  # + the stats loop
    out["otel_inside"]["launched"] = inside_launched
    out["otel_inside"]["counted"] = c.get("thread", 0) + c.get("process", 0)
    out["otel_inside"]["lost"] = inside_launched - out["otel_inside"]["counted"]
    out["otel_outside"]["counted_outside"] = c.get("outside")
    return out


def rows(r: dict) -> list:
    o, i, b = r["otel_outside"], r["otel_inside"], r["bpftrace"]
    lim = min(0.6 * 1000, b["added_ns"])
    cell = lambda x: f"+{x['added_ns']:.0f} (+{x['added_wall_ns']:.0f})"
    return [
        ("1", "untraced ns/launch: thread CPU (wall), median of reps", f"{r['base_ns']:.1f} ({r['base_wall_ns']:.1f})",
         "", None),
        ("1", "otel-gpu outside a request: added ns/launch CPU (wall)", cell(o), "<= 600 and <= bpftrace",
         o["added_ns"] <= lim),
        ("1", "otel-gpu inside a request: added ns/launch CPU (wall)", cell(i), "<= 600 and <= bpftrace",
         i["added_ns"] <= lim),
        ("1", "  inside: events lost / launched", f"{i['lost']} / {i['launched']}", "0", i["lost"] == 0),
        ("1", "bpftrace count(): added ns/launch CPU (wall)", cell(b), "", None),
        ("1", "BPF program run time per launch: outside / inside / bpftrace (ns)",
         f"{o['bpf']['launch_prog_ns']:.0f} / {i['bpf']['launch_prog_ns']:.0f} / {b['bpf']['launch_prog_ns']:.0f}",
         "", None),
    ]
