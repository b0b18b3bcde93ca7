"""The interpreter's context probes are planted per CUDA process, even in the default mode
(where the CUDA libraries are probed file-wide): a Python program that maps the same
interpreter and makes no CUDA call never traps on them. Counted by the kernel
(kernel.bpf_stats_enabled): the collector's py_thread_state program runs for the CUDA
service's GIL re-takes, not for the neighbour's."""
from __future__ import annotations

import subprocess
import sys

from bench import bpfstats
from tests.harness import traced

RETAKES = 20_000  # time.sleep(0) releases and re-takes the GIL each time
NEIGHBOUR = f"import time\nfor _ in range({RETAKES}): time.sleep(0)"


def _runs(collector_pid: int, before: dict) -> int:
    return sum(runs for name, runs, _ in bpfstats.delta(before, bpfstats.snapshot(collector_pid))
               if name == "py_thread_state")


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
    # The service's loop and threads wake now and then meanwhile: far fewer than the neighbour's re-takes.
    assert neighbour < RETAKES // 20, neighbour
    assert mine > 0  # the probes work, and are counted, for the process that needs them
