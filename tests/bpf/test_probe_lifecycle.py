"""Every BPF handler passes the verifier; SIGTERM leaves no probe behind."""
from __future__ import annotations

import os

from otel_gpu.probes.table import CUDA_PROBES


def test_every_cuda_handler_loads():
    from bcc import BPF

    from otel_gpu.probes.source import ProgramOptions, load
    for trace_all in (True, False):
        b = load(ProgramOptions(trace_all=trace_all))
        try:
            names = {r.entry for r in CUDA_PROBES} | {r.ret for r in CUDA_PROBES if r.ret}
            for name in sorted(names):
                b.load_func(name.encode(), BPF.KPROBE)  # uprobes load as kprobe programs
        finally:
            b.cleanup()


def _our_uprobes(pid: int) -> list[str]:
    """tracefs-created uprobes (bcc's fallback when the kernel has no uprobe PMU)."""
    with open("/sys/kernel/debug/tracing/uprobe_events") as f:
        return [line for line in f if f"bcc_{pid}" in line]


def _perf_event_fds(pid: int) -> int:
    """Each attached uprobe/tracepoint is a perf event held open by the collector."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == "anon_inode:[perf_event]"
        except OSError:
            pass
    return n


def test_sigterm_detaches_every_probe(receiver, start_collector, start_target):
    collector = start_collector()
    target = start_target()
    collector.wait_traced(target.pid)
    pid = collector.proc.pid
    held = _perf_event_fds(pid)
    assert held >= 22 + 20, f"expected tracepoints and uprobes held open, found {held}"
    assert collector.stop() == 0
    assert _our_uprobes(pid) == []
    assert not os.path.exists(f"/proc/{pid}")
