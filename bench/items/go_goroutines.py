"""Item 14: what reading goroutines costs a Go process. bench/native/go_launch_loop.go (cgo, the
real libcudart) launches kernels from one goroutine inside an open HTTP request, the
way a Go inference server calls its engine; each launch's probe then reads the running
goroutine (bpf/go_probes.c). Untraced, then a --pid collector with --no-go-goroutines
and with --go-goroutines (default), then untraced again: thread CPU per launch.
Then goroutine wake-ups (--wakes: two goroutines ping-pong over channels inside the
request, GOMAXPROCS 1): every send readies the other one through runtime.runqput, which
the goroutine probes take (on the push after Go's stack check: probes/prologue.py skip).
Untraced, a --pid collector (default mode), untraced again: process CPU per round trip
(two runqput hits)."""
from __future__ import annotations

import statistics

from tests.bpf.targets.go.build import build, toolchains

from ..collector import Collector
from ..native import HERE, LaunchLoop

MODES = ("--no-go-goroutines", "--go-goroutines")


def _binary() -> str | None:
    chains = toolchains()
    if not chains:
        return None
    newest = max(chains, key=lambda v: tuple(map(int, v.split("."))))
    return str(build(str(HERE / "go_launch_loop.go"), chains[newest], stripped=False))


def _loop(binary: str, iters: int, reps: int, collector_args: tuple | None, wakes: bool = False) -> dict:
    loop = LaunchLoop("--iters", str(iters), "--reps", str(reps), *(["--wakes"] if wakes else []), http=True,
                      binary=binary)
    col = Collector(args=("--pid", str(loop.pid), *collector_args)) if collector_args is not None else None
    try:
        if col:
            col.wait_traced(loop.pid)
            traced = next((l for l in col.log.lines if f"tracing pid {loop.pid}" in l), "")
        loop.go()
        res = loop.result()
    finally:
        summary = col.stop() if col else {}
    res["median_ns"] = statistics.median(res["cpu_reps"])
    if col:
        res["goroutines_read"] = "goroutines" in traced
        res["streamed"] = summary.get("cuda_calls_seen", 0)
    return res


def run(quick: bool, starts: list) -> dict:
    binary = _binary()
    if binary is None:
        return {"skipped": "no Go toolchain under .go/ (scripts/setup.sh installs them)"}
    iters, reps = (100_000, 3) if quick else (300_000, 5)
    out: dict = {"iters": iters, "reps": reps, "none": _loop(binary, iters, reps, None)}
    for mode in MODES:
        out[mode.lstrip("-")] = _loop(binary, iters, reps, (mode,))
    out["none_after"] = _loop(binary, iters, reps, None)
    base = statistics.median(out["none"]["cpu_reps"] + out["none_after"]["cpu_reps"])
    out["base_ns"] = base
    for mode in MODES:
        m = out[mode.lstrip("-")]
        m["added_ns"] = m["median_ns"] - base
    trips = iters // 10
    wakes = [_loop(binary, trips, reps, args, wakes=True) for args in (None, (), None)]
    out["wakes"] = {"round_trips": trips, "none_ns": wakes[0]["median_ns"], "traced_ns": wakes[1]["median_ns"],
                    "none_after_ns": wakes[2]["median_ns"],
                    "added_ns": wakes[1]["median_ns"] - (wakes[0]["median_ns"] + wakes[2]["median_ns"]) / 2}
    return out


def rows(r: dict) -> list:
    if "skipped" in r:
        return [("14", "per-launch cost in a Go process", r["skipped"], "", None)]
    off, on = r["no-go-goroutines"], r["go-goroutines"]
    return [
        ("14", "Go process, launches inside a request: thread CPU per launch untraced (ns)",
         f"{r['base_ns']:.0f}", "", None),
        ("14", "  added per launch, --no-go-goroutines / --go-goroutines (ns)",
         f"+{off['added_ns']:.0f} / +{on['added_ns']:.0f}", "", None),
        ("14", "  goroutine read, per launch (on - off, ns)", f"{on['added_ns'] - off['added_ns']:+.0f}"
         + ("" if on["goroutines_read"] else " (goroutines were NOT read: the collector did not recognise Go)"),
         "", None),
    ] + ([("14", "goroutine round trip over channels (2 runqput hits), process CPU ns: untraced/traced/untraced",
           f"{w['none_ns']:.0f}/{w['traced_ns']:.0f}/{w['none_after_ns']:.0f} ({w['added_ns']:+.0f})", "", None)]
         if (w := r.get("wakes")) else [])
