"""Item 13: how probes are planted, uprobe_multi links against the perf-event uprobes
of kernels before 6.6 (--uprobe-links multi | perf), side by side in one run:
- a default-mode collector (every well-known library file probed file-wide at start):
  the time it spent attaching its probes up to `ready`, and SIGINT to exit;
- a --pid collector of a launch loop: the added thread CPU per launch (outside any
  request), every launch counted, and SIGINT to exit."""
from __future__ import annotations

import re
import statistics

from ..collector import Collector
from .launch_overhead import _loop
from ..native import LaunchLoop

ATTACHED_RE = re.compile(r"(\d+) CUDA probes on \d+ files \(attached in ([\d.]+) s")
MODES = ("multi", "perf")
ATTACH_TARGET_S = 0.3  # every probe of a start, attached
STOP_TARGET_S = 6.0    # --shutdown-timeout (5 s, the default) + 1 s


def _attached(col: Collector) -> dict:
    """Probes attached at `ready` and the time spent on them (the `ready` line), or None each."""
    m = next((m for m in (ATTACHED_RE.search(l) for l in col.log.lines) if m), None)
    return {"probes": int(m.group(1)) if m else None, "attach_s": float(m.group(2)) if m else None}


def run(quick: bool, starts: list) -> dict:
    iters, reps = (100_000, 3) if quick else (500_000, 5)
    out: dict = {"iters": iters, "reps": reps, "none": _loop(iters, reps)}
    for mode in MODES:
        col = Collector(args=("--uprobe-links", mode))
        starts.append(col.ready_s)
        attached = _attached(col)
        col.stop()
        out[f"default_{mode}"] = {**attached, "stop_s": col.stop_s}
    for mode in MODES:
        loop = LaunchLoop("--iters", str(iters), "--reps", str(reps))
        col = Collector(args=("--pid", str(loop.pid), "--uprobe-links", mode))
        starts.append(col.ready_s)
        try:
            col.wait_traced(loop.pid)
            attached = _attached(col)
            loop.go()
            res = loop.result()
        finally:
            summary = col.stop()
        res["median_ns"] = statistics.median(res["cpu_reps"])
        out[mode] = {"loop": res, **attached, "stop_s": col.stop_s, "counted": summary.get("cuda_calls_seen", 0),
                     "launched": res["launched"]}
    out["none_after"] = _loop(iters, reps)
    base = statistics.median(out["none"]["cpu_reps"] + out["none_after"]["cpu_reps"])
    out["base_ns"] = base
    for mode in MODES:
        out[mode]["added_ns"] = out[mode]["loop"]["median_ns"] - base
    return out


def rows(r: dict) -> list:
    m, p = r["multi"], r["perf"]
    dm, dp = r["default_multi"], r["default_perf"]

    def pair(key: str, fmt: str, a: dict = m, b: dict = p) -> str:
        cell = lambda v: "?" if v is None else format(v, fmt)  # noqa: E731
        return f"{cell(a[key])} / {cell(b[key])}"
    return [
        ("13", "uprobes as links / as perf events: probes at start, default mode (well-known files)",
         pair("probes", "d", dm, dp), "", None),
        ("13", "  time attaching them, start to ready (s)", pair("attach_s", ".3f", dm, dp),
         f"links < {ATTACH_TARGET_S}", dm["attach_s"] is not None and dm["attach_s"] < ATTACH_TARGET_S),
        ("13", "  SIGINT to exit (s)", pair("stop_s", ".2f", dm, dp), f"links <= {STOP_TARGET_S}",
         dm["stop_s"] is not None and dm["stop_s"] <= STOP_TARGET_S),
        ("13", "uprobes as links / as perf events: probes of a --pid launch loop", pair("probes", "d"), "", None),
        ("13", "  added ns/launch CPU, outside requests", pair("added_ns", "+.0f"), "links <= perf",
         m["added_ns"] <= p["added_ns"]),
        ("13", "  SIGINT to exit (s)", pair("stop_s", ".2f"), f"links <= {STOP_TARGET_S}",
         m["stop_s"] is not None and m["stop_s"] <= STOP_TARGET_S),
        ("13", "  launches counted / made", f"{m['counted']}/{m['launched']} ; {p['counted']}/{p['launched']}",
         "all", m["counted"] == m["launched"] and p["counted"] == p["launched"]),
    ]
