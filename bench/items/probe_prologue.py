"""Item 15: what an entry uprobe costs by where it sits. One function of a CET build
(tests/bpf/targets/cet_library.c: endbr64, then push %rbp) called N times
(native/call_loop.c, thread CPU per call): untraced; an empty BPF program on its entry
(the endbr64: single-stepped out of line); on the push after it (emulated), where the
collector places it (probes/prologue.py). Perf-event uprobes (both backends trap the same
way); medians of the reps, in one window."""
from __future__ import annotations

import statistics
import subprocess

from bcc import BPF

from otel_gpu.probes.prologue import entry_skip
from otel_gpu.probes.source import kernel_headers_hint
from tests.harness import TARGETS

from ..native import BUILD, build

EMPTY = b"#include <uapi/linux/ptrace.h>\nint empty(struct pt_regs *ctx) { return 0; }"


def _library() -> str:
    out = BUILD / "libcet.so"
    BUILD.mkdir(parents=True, exist_ok=True)
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-fno-omit-frame-pointer", "-fcf-protection=full",
                    "-o", str(out), str(TARGETS / "cet_library.c")], check=True)
    return str(out)


def _per_call(loop, lib: str, calls: int) -> float:
    return float(subprocess.run([str(loop), lib, "probed", str(calls)], capture_output=True, text=True,
                                check=True, timeout=120).stdout)


def run(quick: bool) -> dict:
    calls, reps = (20_000, 3) if quick else (200_000, 5)
    loop, lib = build("call_loop"), _library()
    _, entry = BPF._check_path_symbol(lib.encode(), b"probed", None, -1)
    out = {"calls": calls, "reps": reps, "skip": entry_skip(lib, entry), "ns": {}}
    kernel_headers_hint()
    phases = {"untraced": None, "on the entry (endbr64)": 0, "after endbr64 (push)": out["skip"]}
    times: dict = {name: [] for name in phases}
    for _ in range(reps):  # interleaved: drift does not decide the comparison
        for name, skip in phases.items():
            b = None
            if skip is not None:
                b = BPF(text=EMPTY)
                b.attach_uprobe(name=lib.encode(), sym=b"probed", fn_name=b"empty", sym_off=skip)
            try:
                times[name].append(_per_call(loop, lib, calls))
            finally:
                if b is not None:
                    b.cleanup()
    for name, xs in times.items():
        out["ns"][name] = {"reps": xs, "median": statistics.median(xs)}
    base = out["ns"]["untraced"]["median"]
    out["added_ns"] = {name: out["ns"][name]["median"] - base for name in phases if name != "untraced"}
    return out


def rows(r: dict) -> list:
    a = r["added_ns"]
    entry, after = a["on the entry (endbr64)"], a["after endbr64 (push)"]
    return [("15", "CET function: added ns per call, probe on the entry (endbr64) / after it (push), thread CPU",
             f"+{entry:.0f} / +{after:.0f} (skip {r['skip']} bytes)", "after <= entry / 5", after <= entry / 5)]
