"""Item 11: what the exact runtime/driver de-duplication costs per launch, outside
requests (the in-kernel rollup path): a C loop through the stub libcudart that reaches
the stub libcuda (runtime launch + its pass-through cuLaunchKernel, dropped by the
return-address check) and through a library's own cuLaunchKernel (counted), untraced
and traced by otel-gpu in its default mode (the collector writes the loop's runtime
code ranges at its scan), plus each BPF program's own run time per call."""
from __future__ import annotations

import statistics
import subprocess
from pathlib import Path

from .. import bpfstats
from ..collector import Collector
from ..native import BUILD, build

TARGETS = Path(__file__).resolve().parents[2] / "tests" / "bpf" / "targets"
MODES = {"r": "runtime launch reaching the driver", "l": "a library's own cuLaunchKernel"}


def _gcc(source: str, name: str, *link: str) -> str:
    out = BUILD / name
    src = TARGETS / source
    if not out.exists() or out.stat().st_mtime < src.stat().st_mtime:
        BUILD.mkdir(parents=True, exist_ok=True)
        subprocess.run(["gcc", "-O2", "-shared", "-fPIC", "-o", str(out), str(src), *link], check=True)
    return str(out)


def _stubs() -> tuple[str, str]:
    _gcc("stub_libcuda.c", "libcuda.so.1")
    link = [f"-L{BUILD}", "-l:libcuda.so.1", f"-Wl,-rpath,{BUILD}"]
    return _gcc("stub_cudart_driver.c", "libcudart-dedup.so", *link), _gcc("stub_driver_library.c",
                                                                           "libdedup_blas.so", *link)


def _loop(mode: str, iters: int, reps: int, before_go=None) -> dict:
    rt, lib = _stubs()
    proc = subprocess.Popen([str(build("dedup_loop")), rt, lib, mode, "--iters", str(iters), "--reps", str(reps)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True)
    line = proc.stdout.readline()
    if not line.startswith("ready "):
        proc.kill()
        raise RuntimeError(f"dedup_loop did not start: {line!r}")
    if before_go:
        before_go(int(line.split()[1]))
    out, _ = proc.communicate("go\n", timeout=600)
    cpu = [float(l.split()[3]) for l in out.splitlines() if l.startswith("rep ")]
    return {"cpu_reps": cpu, "median_ns": statistics.median(cpu)}


def run(quick: bool, starts: list) -> dict:
    iters, reps = (50_000, 3) if quick else (200_000, 3)
    out = {"iters": iters, "reps": reps}
    base = {m: _loop(m, iters, reps) for m in MODES}
    col = Collector()
    starts.append(col.ready_s)
    try:
        for mode in MODES:
            traced = _loop(mode, iters, reps, before_go=col.wait_traced)
            with bpfstats.enabled():
                before = bpfstats.snapshot(col.pid)
                _loop(mode, iters, 1, before_go=col.wait_traced)
                ran = bpfstats.delta(before, bpfstats.snapshot(col.pid))
            # The probes that ran once per call: cuda_launch_kernel and/or cu_launch_kernel.
            traced["bpf"] = {name: ns / max(runs, 1) for name, runs, ns in ran if abs(runs - iters) < iters // 10}
            traced["added_ns"] = traced["median_ns"] - base[mode]["median_ns"]
            out[mode] = traced
    finally:
        out["collector"] = col.stop()
    out["untraced"] = base
    return out


def rows(r: dict) -> list:
    out = []
    for mode, what in MODES.items():
        o = r[mode]
        progs = ", ".join(f"{name} {ns:.0f}" for name, ns in sorted(o["bpf"].items())) or "?"
        out.append(("11", f"{what}: added ns/launch thread CPU", f"+{o['added_ns']:.0f}", "", None))
        out.append(("11", f"  BPF run time per launch (ns): {progs}", f"{sum(o['bpf'].values()):.0f}", "", None))
    return out
