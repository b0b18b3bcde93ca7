"""Every BPF handler passes the verifier; SIGTERM leaves no probe behind."""
from __future__ import annotations

import os

import pytest

from otel_gpu.config import DEFAULT_BPF_CACHE
from otel_gpu.probes.rows import (CUDA_PROBES, GRAPH_RAW_TRACEPOINTS, HTTP_RAW_TRACEPOINTS, HTTP_TRACEPOINTS,
                                  LIBRARY_RAW_TRACEPOINTS, LIBRARY_TRACEPOINTS, SCHED_TRACEPOINTS)
from tests.bpf.probe_harness import open_fds


def test_every_cuda_handler_loads():
    from bcc import BPF

    from otel_gpu.probes.source import ProgramOptions, load
    for trace_all in (True, False):
        b = load(ProgramOptions(trace_all=trace_all, bpf_cache=DEFAULT_BPF_CACHE))  # the verifier checks either way
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


def _probe_fds(pid: int) -> int:
    """Every probe the collector holds open, perf event or link."""
    return open_fds("[perf_event]", pid) + open_fds("bpf_link", pid)


@pytest.mark.parametrize("links", ["auto", "perf"])
def test_sigterm_detaches_every_probe(receiver, start_collector, start_target, links):
    """auto: uprobe_multi links on this kernel (6.6+); perf: the older kernels' fallback."""
    collector = start_collector(OTEL_GPU_UPROBE_LINKS=links)
    target = start_target()
    collector.wait_traced(target.pid)
    pid = collector.proc.pid
    expected = "uprobe_multi links" if links == "auto" else "perf-event uprobes (as configured)"
    assert any(f"uprobes: {expected}" in line for line in collector.log.lines)
    # The tracepoints are perf events; the raw ones (every syscall's entry and exit,
    # graph_probes.c's process exit, the time split's sched_switch) are links.
    tracepoints = len(HTTP_TRACEPOINTS) + len(LIBRARY_TRACEPOINTS)
    raw = len(HTTP_RAW_TRACEPOINTS + GRAPH_RAW_TRACEPOINTS + LIBRARY_RAW_TRACEPOINTS + SCHED_TRACEPOINTS)
    perf, link = open_fds("[perf_event]", pid) - tracepoints, open_fds("bpf_link", pid) - raw
    assert perf >= 0 and link >= 0, (perf, link)
    uprobes, others = (link, perf) if links == "auto" else (perf, link)
    assert uprobes >= 20 and others == 0, (perf, link)
    assert collector.stop() == 0
    assert _our_uprobes(pid) == []
    assert not os.path.exists(f"/proc/{pid}")
