"""The interpreter's context probe is planted per CUDA process, even in the default mode
(where the CUDA libraries are probed file-wide): a Python program that maps the same
interpreter and makes no CUDA call never traps on it. Counted by the kernel
(kernel.bpf_stats_enabled): the collector's context-copy program runs for the CUDA
service's copies (its asyncio tasks), not for the neighbour's."""
from __future__ import annotations

import subprocess
import sys

from bench import bpfstats
from otel_gpu.probes.rows import PYTHON_PROBES
from tests.harness import traced

COPIES = 20_000  # each copy_context() is a PyContext_CopyCurrent
NEIGHBOUR = f"import contextvars\nfor _ in range({COPIES}): contextvars.copy_context()"
PROGRAMS = {r.ret[:15] for r in PYTHON_PROBES if r.ret}  # the kernel cuts names


def _runs(collector_pid: int, before: dict) -> int:
    return sum(runs for name, runs, _ in bpfstats.delta(before, bpfstats.snapshot(collector_pid))
               if name in PROGRAMS)


def test_a_python_neighbour_without_cuda_never_runs_the_context_probes(receiver, start_collector, start_target):
    collector = start_collector()  # the default mode: CUDA libraries probed file-wide
    service = traced(collector, start_target, "asgi")
    assert any(f"for pid {service.pid} only" in line and "python" in line.lower() for line in collector.log.lines), \
        [line for line in collector.log.lines if "attached" in line]
    with bpfstats.enabled():
        before = bpfstats.snapshot(collector.proc.pid)
        done = subprocess.run([sys.executable, "-c", NEIGHBOUR], timeout=60)  # the same interpreter
        assert done.returncode == 0
        neighbour = _runs(collector.proc.pid, before)
        before = bpfstats.snapshot(collector.proc.pid)
        for _ in range(20):
            service.get("/work?launches=1")
        mine = _runs(collector.proc.pid, before)
    # The service's loop makes a task now and then meanwhile: far fewer than the neighbour's copies.
    assert neighbour < COPIES // 20, neighbour
    assert mine > 0  # the probes work, and are counted, for the process that needs them
