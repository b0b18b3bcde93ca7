"""Another eBPF tool on the same function: bpftrace's uprobe on cudaLaunchKernel
attached before the collector, and after it. Both must count every launch.

Debian's bcc bindings used to register uprobes with a garbage reference-counter
offset (otel_gpu/probes/bcc_abi.py), and the kernel refuses a second uprobe on the
same (file, offset) with a different one: whichever tool came second got nothing."""
from __future__ import annotations

import re
import shutil
import signal
import subprocess
import sys

import pytest

from otel_gpu.demo.cuda_work import find_cudart
from otel_gpu.demo.runner import LineWatcher, interrupt_until, stop_process
from tests.bpf.targets.relia_support import wait_until
from tests.harness import Target

pytestmark = pytest.mark.skipif(shutil.which("bpftrace") is None, reason="bpftrace not installed (scripts/setup.sh)")

LAUNCHES = 37
# Maps libcudart, waits for "go", makes LAUNCHES launches, says so, waits to be stopped.
TARGET = f"""
import sys
from otel_gpu.demo.cuda_work import CudaWork
w = CudaWork()
print("listening on 0", file=sys.stderr, flush=True)
sys.stdin.readline()
for _ in range({LAUNCHES}):
    w.launch("softmax", (2, 1, 1), (64, 1, 1))
print("launched", file=sys.stderr, flush=True)
sys.stdin.readline()
"""


class Bpftrace:
    """bpftrace counting one process's cudaLaunchKernel calls; BEGIN fires once every
    probe is attached."""

    def __init__(self, pid: int) -> None:
        program = (f'uprobe:{find_cudart()}:cudaLaunchKernel /pid == {pid}/ {{ @launches = count(); }} '
                   'BEGIN { printf("attached\\n"); }')
        self.proc = subprocess.Popen(["bpftrace", "-e", program], stdout=subprocess.PIPE,
                                     stderr=subprocess.STDOUT, text=True)
        self.out = LineWatcher(self.proc.stdout, echo=None)
        assert self.out.wait_for("attached", 60), "bpftrace did not attach:\n" + "".join(self.out.lines)

    def count(self) -> int:
        """Stops bpftrace (it prints its maps on SIGINT) and returns the count."""
        assert interrupt_until(self.proc, lambda t: self.out.wait_for("@launches", t)), "".join(self.out.lines)
        line = next(l for l in self.out.lines if "@launches" in l)
        return int(re.search(r"@launches: (\d+)", line).group(1))

    def stop(self) -> None:
        stop_process(self.proc, signal.SIGINT, 10)


def _collector_launches(receiver, pid: int) -> int:
    return sum(s.attributes.get("gpu.launches", 0) for s in receiver.spans
               if s.parent_span_id == "" and s.attributes.get("process.pid") == pid)


def _launch_and_count(collector, receiver, target: Target, bpftrace: Bpftrace) -> tuple[int, int]:
    target.go_raw()
    assert target.log.wait_for("launched", 20)
    wait_until(lambda: _collector_launches(receiver, target.pid) >= LAUNCHES, 20)
    ours = _collector_launches(receiver, target.pid)
    theirs = bpftrace.count()
    assert not [l for l in collector.log.lines if "cannot attach" in l], collector.log.lines
    return ours, theirs


@pytest.mark.parametrize("first", ["bpftrace", "otel-gpu"])
def test_bpftrace_and_otel_gpu_both_count_every_launch(first, receiver, start_collector):
    target = Target([sys.executable, "-c", TARGET])
    bpftrace = None
    try:
        if first == "bpftrace":
            bpftrace = Bpftrace(target.pid)
            collector = start_collector("--pid", str(target.pid))
            collector.wait_traced(target.pid)
        else:
            collector = start_collector("--pid", str(target.pid))
            collector.wait_traced(target.pid)
            assert collector.log.wait_for("CUDA probes to", 20)
            bpftrace = Bpftrace(target.pid)
        ours, theirs = _launch_and_count(collector, receiver, target, bpftrace)
    finally:
        if bpftrace:
            bpftrace.stop()
        target.stop()
    assert (ours, theirs) == (LAUNCHES, LAUNCHES), f"otel-gpu counted {ours}, bpftrace {theirs}"
