"""Describes the machine a run was measured on, and what else was busy on it."""
from __future__ import annotations

import glob
import os
import platform
import shutil
import subprocess
import time


def _cpu_model() -> str:
    with open("/proc/cpuinfo") as f:
        for line in f:
            if line.startswith("model name"):
                return line.split(":", 1)[1].strip()
    return platform.processor() or "unknown"


def _mem_gib() -> float:
    with open("/proc/meminfo") as f:
        for line in f:
            if line.startswith("MemTotal:"):
                return round(int(line.split()[1]) / 2**20, 1)
    return 0.0


def _gpu() -> str:
    if shutil.which("nvidia-smi"):
        try:
            out = subprocess.run(["nvidia-smi", "--query-gpu=name", "--format=csv,noheader"],
                                 capture_output=True, text=True, timeout=20).stdout.strip()
            if out:
                return out.replace("\n", ", ")
        except (OSError, subprocess.TimeoutExpired):
            pass
    return "present (no nvidia-smi)" if glob.glob("/dev/nvidia[0-9]*") else "none"


def describe() -> dict:
    return {"host": platform.node(), "cpu": _cpu_model(), "cores": os.cpu_count(),
            "kernel": platform.release(), "memory_gib": _mem_gib(), "gpu": _gpu()}


def foreign_tracers() -> list[str]:
    """Collectors or bpftrace runs not started by this bench: their probes would
    be timed along with ours (uprobes attach per file, for every process)."""
    found = []
    for d in glob.glob("/proc/[0-9]*"):
        try:
            with open(f"{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
            with open(f"{d}/cmdline", "rb") as f:
                args = f.read().replace(b"\0", b" ").decode(errors="replace")
        except (OSError, ValueError, IndexError):
            continue
        if ppid == os.getpid():
            continue
        if "otel_gpu.cli run" in args or args.startswith("bpftrace"):
            found.append(f"{d[6:]}: {args.strip()[:100]}")
    return found


def wait_quiet(timeout_s: float) -> list[str]:
    """Waits (bounded) until no foreign tracer runs; returns those still running."""
    deadline = time.monotonic() + timeout_s
    while (busy := foreign_tracers()) and time.monotonic() < deadline:
        time.sleep(2)
    return busy


def loadavg() -> float:
    return os.getloadavg()[0]
