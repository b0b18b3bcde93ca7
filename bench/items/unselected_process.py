"""Item 1c: what a collector costs a CUDA process it does not trace. With --pid/--exe
the uprobes are per selected process, so another process mapping the same
libcudart should pay nothing; in the default mode every CUDA process is traced and
pays the probe. The same launch_loop, side by side in one run: no collector, the
collector in its default mode, the collector with --pid <another launch_loop> (this
one untraced), no collector again. The selected loop then runs too: its launches
must all be counted (the collector's `stopped:` line)."""
from __future__ import annotations

import statistics

from ..collector import Collector
from .launch_overhead import _loop
from ..native import LaunchLoop

SELECTED_ITERS = 1000


def run(quick: bool, starts: list) -> dict:
    iters, reps = (100_000, 3) if quick else (500_000, 5)
    out: dict = {"iters": iters, "reps": reps}
    out["none"] = _loop(iters, reps)
    col = Collector()
    starts.append(col.ready_s)
    try:
        out["default"] = _loop(iters, reps, before_go=col.wait_traced)
    finally:
        out["default"]["collector"] = col.stop()
    selected = LaunchLoop("--iters", str(SELECTED_ITERS), "--reps", "1")  # warmed up before the collector
    col = Collector(args=("--pid", str(selected.pid)))
    starts.append(col.ready_s)
    try:
        col.wait_traced(selected.pid)
        out["pid_other"] = _loop(iters, reps)
        selected.go()
        selected.result()
    finally:
        out["pid_other"]["collector"] = col.stop()
    out["selected_counted"] = out["pid_other"]["collector"].get("cuda_calls_seen", 0)
    out["none_after"] = _loop(iters, reps)
    base = statistics.median(out["none"]["cpu_reps"] + out["none_after"]["cpu_reps"])
    base_wall = statistics.median(out["none"]["reps"] + out["none_after"]["reps"])
    out["base_ns"], out["base_wall_ns"] = base, base_wall
    for k in ("default", "pid_other"):
        out[k]["added_ns"] = out[k]["median_ns"] - base
        out[k]["added_wall_ns"] = out[k]["median_wall_ns"] - base_wall
    return out


def rows(r: dict) -> list:
    cell = lambda x: f"{x['added_ns']:+.0f} ({x['added_wall_ns']:+.0f})"
    p = r["pid_other"]
    return [
        ("1c", "no collector: ns/launch CPU (wall), median of reps, before and after",
         f"{r['base_ns']:.1f} ({r['base_wall_ns']:.1f})", "", None),
        ("1c", "collector, default mode (this process traced): added ns/launch CPU (wall)", cell(r["default"]),
         "", None),
        ("1c", "collector --pid <another process> (this one untraced): added ns/launch CPU (wall)", cell(p),
         "~0 (noise)", p["added_ns"] <= 50),
        ("1c", "  the selected process: launches counted / made", f"{r['selected_counted']} / {SELECTED_ITERS}",
         "all", r["selected_counted"] == SELECTED_ITERS),
    ]
