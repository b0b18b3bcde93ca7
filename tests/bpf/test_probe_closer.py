"""Attacher.detach_all closes every probe before it returns (the closer's threads, not
the process's exit, do it): the collector's `probes detached` means detached."""
from __future__ import annotations

import os
import site

from otel_gpu.probes.attacher import Attacher
from otel_gpu.probes.discovery import known_library_files
from otel_gpu.ratelimit import Stats
from tests.bpf.probe_harness import open_fds


def _tracefs_uprobes() -> list[str]:
    """tracefs-made uprobes of this process (bcc's fallback without a uprobe PMU)."""
    with open("/sys/kernel/tracing/uprobe_events") as f:
        return [line for line in f if f"bcc_{os.getpid()}" in line]


def test_detach_all_closes_every_probe_before_returning():
    from otel_gpu.probes.source import ProgramOptions, load
    before = open_fds("[perf_event]")
    bpf = load(ProgramOptions())
    stats = Stats()
    attacher = Attacher(bpf, stats)
    targets = known_library_files(site_dirs=site.getsitepackages())
    assert targets, "no CUDA runtime or libssl file found to probe"
    probes = sum(attacher.attach(t) for t in targets)
    tracepoints = len(bpf.tracepoint_fds)
    assert probes >= 20 and tracepoints >= 10
    assert open_fds("[perf_event]") - before == probes + tracepoints

    attacher.detach_all(timeout=300)

    assert open_fds("[perf_event]") == before, "perf events still open after detach_all"
    assert attacher.closer.pending() == 0
    assert bpf.uprobe_fds == {} and bpf.tracepoint_fds == {} and bpf.num_open_uprobes() == 0
    assert _tracefs_uprobes() == []
    assert "probe_detach_failed" not in stats.snapshot()
