"""Item 10: host time added per probed ncclAllReduce, outside requests (the in-kernel
rollup path, as a tensor-parallel worker between requests): the same C loop through the
stub libnccl.so.2 of the bpf tests, untraced and traced by otel-gpu, plus the BPF
program's own run time per call (kernel BPF stats)."""
from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

from .. import bpfstats
from ..collector import Collector
from ..native import BUILD, build

STUB = Path(__file__).resolve().parents[2] / "tests" / "bpf" / "targets" / "stub_libnccl.c"


def _stub() -> str:
    out = BUILD / "libnccl.so.2"
    if not out.exists() or out.stat().st_mtime < STUB.stat().st_mtime:
        BUILD.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(STUB)], check=True)
    return str(out)


def _loop(iters: int, reps: int, before_go=None) -> dict:
    proc = subprocess.Popen([str(build("nccl_loop")), _stub(), "--iters", str(iters), "--reps", str(reps)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"nccl_loop did not start: {line!r}")
    if before_go:
        before_go(int(line.split()[1]))
    out, _ = proc.communicate("go\n", timeout=600)
    wall = [float(l.split()[2]) for l in out.splitlines() if l.startswith("rep ")]
    cpu = [float(l.split()[3]) for l in out.splitlines() if l.startswith("rep ")]
    return {"reps": wall, "cpu_reps": cpu, "median_ns": statistics.median(cpu),
            "median_wall_ns": statistics.median(wall)}


def run(quick: bool, starts: list) -> dict:
    iters, reps = (100_000, 3) if quick else (500_000, 5)
    out = {"iters": iters, "reps": reps, "untraced": _loop(iters, reps)}
    col = Collector()
    starts.append(col.ready_s)
    try:
        out["otel_outside"] = _loop(iters, reps, before_go=col.wait_traced)
        with bpfstats.enabled():
            before = bpfstats.snapshot(col.pid)
            _loop(iters, 1, before_go=col.wait_traced)
            ran = bpfstats.delta(before, bpfstats.snapshot(col.pid))
        prog = min(ran, key=lambda r: abs(r[1] - iters), default=("?", 0, 0))
        out["otel_outside"]["bpf"] = {"prog": prog[0], "runs": prog[1], "ns": prog[2] / max(prog[1], 1)}
    finally:
        out["collector"] = col.stop()
    out["untraced_after"] = _loop(iters, reps)
    base = statistics.median(out["untraced"]["cpu_reps"] + out["untraced_after"]["cpu_reps"])
    base_wall = statistics.median(out["untraced"]["reps"] + out["untraced_after"]["reps"])
    out["base_ns"], out["base_wall_ns"] = base, base_wall
    o = out["otel_outside"]
    o["added_ns"], o["added_wall_ns"] = o["median_ns"] - base, o["median_wall_ns"] - base_wall
    return out


def rows(r: dict) -> list:
    o = r["otel_outside"]
    return [
        ("10", "untraced ns/ncclAllReduce (stub): thread CPU (wall)", f"{r['base_ns']:.1f} ({r['base_wall_ns']:.1f})",
         "", None),
        ("10", "otel-gpu outside a request: added ns/ncclAllReduce CPU (wall)",
         f"+{o['added_ns']:.0f} (+{o['added_wall_ns']:.0f})", "", None),
        ("10", "  BPF program run time per call (ns)", f"{o['bpf']['ns']:.0f} ({o['bpf']['prog']})", "", None),
    ]
