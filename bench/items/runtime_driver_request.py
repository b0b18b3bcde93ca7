"""Item 21 (#44 items 1, 3, 4): a launch inside a request when the runtime reaches the
driver, as every launch does on a GPU. The stand-in libcudart (tests/bpf/targets/
stub_cudart_driver.c) calls the stand-in libcuda's cuLaunchKernel from its own code; both
are built with the real libraries' prologue (a frame pointer: every function starts with
`push %rbp`, which x86 emulates, so no probe here is single-stepped). Two request shapes:
a decode step (requests of 20,000 launches) and a small one (requests of 200). Interleaved
rounds of fresh processes, one per variant in an order that rotates: untraced; bpftrace
with one uprobe on cuLaunchKernel (count()); the bare trap (bpftrace, empty program);
otel-gpu (--exe: only its own processes). Each variant runs its own copy of both
libraries, so a tracer's uprobes fire only in its processes. An otel-gpu loop is timed once
the collector counts its runtime launches at the driver alone (it warms until then), as a
long-lived service's are after its first seconds. Then one more otel-gpu loop per shape
with the kernel's BPF stats on: its launch programs' runs per launch."""
from __future__ import annotations

import statistics
import subprocess
import time
from pathlib import Path

from otel_gpu.probes.prologue import emulated, entry_code

from .. import bpfstats
from ..collector import Collector
from ..native import BUILD, WARMUP_LAUNCHES, LaunchLoop, build, private_copy
from .launch_overhead import bpftrace_on

TARGETS = Path(__file__).resolve().parents[2] / "tests" / "bpf" / "targets"
VARIANTS = ("untraced", "otel", "bpftrace", "trap")
OTEL_EXE = "rd_otel_loop"  # the collector's --exe (comm: 15 characters at most)
SHAPES = {"decode": 20_000, "small": 200}  # launches a request
LAUNCHES_A_PROCESS = 60_000  # timed, per process and shape: 3 decode requests, 300 small ones
RUNTIME, DRIVER = "libcudart.so.12", "libcuda.so.1"
AT_DRIVER_WAIT_S = 15.0  # STABLE_S and the next review, with room on a busy VM


def _libraries() -> dict:
    """variant -> its folder: the stand-in driver and runtime (rpath $ORIGIN), copied."""
    src = BUILD / "runtime_driver" / "built"
    src.mkdir(parents=True, exist_ok=True)
    flags = ["gcc", "-fno-omit-frame-pointer", "-shared", "-fPIC"]
    # The driver at -O0: optimised, gcc gives a function that touches no stack no frame, even with
    # -fno-omit-frame-pointer, and its first instruction (xor) would be single-stepped.
    subprocess.run([*flags, "-O0", "-o", str(src / DRIVER), str(TARGETS / "stub_libcuda.c")], check=True)
    subprocess.run([*flags, "-O2", "-o", str(src / RUNTIME), str(TARGETS / "stub_cudart_driver.c"), f"-L{src}",
                    f"-l:{DRIVER}", "-Wl,-rpath,$ORIGIN"], check=True)
    out = {}
    for v in VARIANTS:
        folder = BUILD / "runtime_driver" / v
        for name in (DRIVER, RUNTIME):
            private_copy(src / name, folder / name)
        out[v] = folder
    return out


def _prologues(folder: Path) -> dict:
    """Whether x86 emulates the first instruction of each probed launch entry."""
    return {sym: emulated(entry_code(str(folder / lib), sym))
            for lib, sym in ((RUNTIME, "cudaLaunchKernel"), (DRIVER, "cuLaunchKernel"))}


def _loop(folder: Path, shape: str, binary: str, before_go=None) -> dict:
    n = SHAPES[shape]
    loop = LaunchLoop("--iters", str(n), http=True, cudart=str(folder / RUNTIME), binary=binary,
                      requests=LAUNCHES_A_PROCESS // n // 3, reps=3)
    if before_go:
        before_go(loop)
    loop.go()
    res = loop.result()
    res["median_ns"] = statistics.median(res["cpu_reps"])
    res["expected_answers"] = loop.sequence
    return res


def _at_driver(col: Collector):
    """before_go for otel-gpu's loops: traced, then warm launches until the collector counts
    the process's runtime launches at the driver alone (probes/launch_routes.py: its kernel's
    handle paired, then stable for STABLE_S), as a long-lived service's are after its first
    seconds. Counts a loop that never gets there (then its launches run both probes)."""
    def wait(loop) -> None:
        col.wait_traced(loop.pid)
        if not col.until_at_driver(loop.pid, AT_DRIVER_WAIT_S, lambda: loop.warm(1000)):
            col.not_at_driver += 1
            return
        loop.warm(1000)  # the runtime probes' links close in the background (probes/closer.py)
    return wait


def _program_runs(col: Collector, folder: Path, shape: str, binary: str) -> dict:
    """One untimed otel-gpu loop with the stats on: launch programs' runs and ns a launch."""
    taken = {}

    def traced_then_snapshot(loop) -> None:
        _at_driver(col)(loop)
        taken["before"] = bpfstats.snapshot(col.pid)

    with bpfstats.enabled():
        res = _loop(folder, shape, binary, traced_then_snapshot)
        ran = bpfstats.delta(taken["before"], bpfstats.snapshot(col.pid))
    return {"launched": res["launched"], **bpfstats.launch_runs(ran, res["launched"])}


def run(quick: bool, starts: list) -> dict:
    n_rounds, budget_s = (5, 150) if quick else (9, 400)
    folders = _libraries()
    loop = build()
    binaries = {v: str(loop) for v in VARIANTS} | {"otel": private_copy(loop, BUILD / "runtime_driver" / OTEL_EXE)}
    out = {"shapes": SHAPES, "launches_a_process": LAUNCHES_A_PROCESS, "prologue_emulated": _prologues(folders["otel"])}
    col = Collector(args=("--exe", OTEL_EXE))
    col.not_at_driver = 0
    starts.append(col.ready_s)
    rounds = []
    try:
        with bpftrace_on(str(folders["bpftrace"] / DRIVER), probe="cuLaunchKernel") as bt, \
                bpftrace_on(str(folders["trap"] / DRIVER), action="", probe="cuLaunchKernel"):
            deadline = time.monotonic() + budget_s
            for i in range(n_rounds):
                if time.monotonic() > deadline:
                    break
                order = VARIANTS[i % 4:] + VARIANTS[:i % 4]
                rounds.append({shape: {v: _loop(folders[v], shape, binaries[v],
                                                _at_driver(col) if v == "otel" else None) for v in order}
                               for shape in SHAPES})
            out["bpf"] = {shape: _program_runs(col, folders["otel"], shape, binaries["otel"]) for shape in SHAPES}
    finally:
        out["collector"] = col.stop()
    out["rounds"] = len(rounds)
    out["not_at_driver"] = col.not_at_driver
    for shape in SHAPES:
        per = {v: [r[shape][v]["median_ns"] for r in rounds] for v in VARIANTS}
        base = statistics.median(per["untraced"])
        added = {v: [x - base for x in per[v]] for v in VARIANTS if v != "untraced"}
        # Round by round: otel-gpu's added time over the trap's in the same round (the four
        # variants run back to back), against each round's own untraced loop.
        paired = [(o - u) / (t - u) for o, t, u in zip(per["otel"], per["trap"], per["untraced"]) if t > u]
        out[shape] = {"untraced_ns": base, **{f"{v}_added_ns": statistics.median(xs) for v, xs in added.items()},
                      "rounds_ns": per, "paired_ratio": statistics.median(paired) if paired else None,
                      "paired_spread": (min(paired), max(paired)) if paired else None,
                      **{f"{v}_spread_ns": (min(xs), max(xs)) for v, xs in added.items()},
                      "launched": {v: sum(r[shape][v]["launched"] for r in rounds) for v in VARIANTS},
                      "answered": {v: sum(r[shape][v].get("answered", 0) for r in rounds) for v in VARIANTS},
                      "expected_answers": {v: sum(r[shape][v]["expected_answers"] for r in rounds) for v in VARIANTS}}
    c = out["collector"]
    in_requests = sum(out[s]["launched"]["otel"] for s in SHAPES) + sum(b["launched"] for b in out["bpf"].values())
    out["otel_counted"] = {"in_requests": c.get("thread", 0) + c.get("process", 0) if c else None,
                           "expected": in_requests, "outside": c.get("outside") if c else None,
                           "deduped": (c.get("counted") or {}).get("driver_launches_deduped") if c else None,
                           "as_runtime": (c.get("counted") or {}).get("driver_launches_as_runtime") if c else None}
    # bpftrace attaches by path before each process starts: its warm-up launches count too.
    out["bpftrace_counted"] = {"counted": bt["counted"], "expected": sum(
        out[s]["launched"]["bpftrace"] + out["rounds"] * WARMUP_LAUNCHES for s in SHAPES)}
    return out


def rows(r: dict) -> list:
    out = [("21", "probed entries emulated (push %rbp first): " +
            ", ".join(f"{k} {'yes' if v else 'no'}" for k, v in r["prologue_emulated"].items()), "", "all",
            all(r["prologue_emulated"].values()))]
    for shape, n in SHAPES.items():
        s, b = r[shape], r["bpf"][shape]
        lo, hi = s["otel_spread_ns"]
        ratio = s["otel_added_ns"] / s["trap_added_ns"] if s["trap_added_ns"] > 0 else float("inf")
        out += [
            ("21", f"{shape} ({n:,} launches a request): untraced ns a launch, thread CPU", f"{s['untraced_ns']:.0f}",
             "", None),
            ("21", f"  added a launch: otel-gpu (spread over {r['rounds']} rounds) / bpftrace count() / the trap alone",
             f"+{s['otel_added_ns']:.0f} ({lo:+.0f}..{hi:+.0f}) / +{s['bpftrace_added_ns']:.0f} / "
             f"+{s['trap_added_ns']:.0f}", "", None),
            ("21", "  otel-gpu / the trap alone (#44 item 3)", f"{ratio:.2f}x", "<= 1.2x", ratio <= 1.2),
            ("21", "  the same round by round: median (spread) of otel-gpu's added / the trap's in one round",
             f"{s['paired_ratio']:.2f}x ({s['paired_spread'][0]:.2f}..{s['paired_spread'][1]:.2f})"
             if s.get("paired_ratio") else "n/a", "", None),
            ("21", "  otel-gpu / bpftrace count()", f"{s['otel_added_ns'] / max(s['bpftrace_added_ns'], 1):.2f}x",
             "", None),
            ("21", "  otel-gpu launch program runs a launch, bpf_stats (#44 item 1)",
             f"{b['runs_per_launch']:.2f} ({b['ns_per_launch']:.0f} ns of programs)", "== 1.00",
             round(b["runs_per_launch"], 2) == 1.00),
            ("21", "  requests answered / sent, every variant",
             f"{sum(s['answered'].values())} / {sum(s['expected_answers'].values())}", "==",
             s["answered"] == s["expected_answers"]),
        ]
    out.append(("21", "otel-gpu loops timed with their runtime launches at the driver alone (launch_routes.py)",
                f"{r['rounds'] * len(SHAPES) + len(SHAPES) - r['not_at_driver']} / {r['rounds'] * len(SHAPES) + len(SHAPES)}",
                "==", r["not_at_driver"] == 0))
    o = r["otel_counted"]
    out.append(("21", "otel-gpu launches counted in requests / made there (runtime + driver, de-duplicated)",
                f"{o['in_requests']} / {o['expected']} ({o['as_runtime']} counted at the driver alone, "
                f"{o['deduped']} driver passes dropped)", "==",
                o["in_requests"] == o["expected"]))
    b = r["bpftrace_counted"]
    out.append(("21", "  isolation: bpftrace @n / its processes' launches", f"{b['counted']} / {b['expected']}", "==",
                b["counted"] == b["expected"]))
    return out
