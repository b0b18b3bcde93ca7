"""Attacher.detach_all closes every probe before it returns (the closer's threads, not
the process's exit, do it): the collector's `probes detached` means detached. Both ways
of planting uprobes: uprobe_multi links (descriptors "bpf_link") and perf events."""
from __future__ import annotations

import os
import site

import pytest

from otel_gpu.config import DEFAULT_BPF_CACHE
from otel_gpu.probes.rows import (GRAPH_RAW_TRACEPOINTS, HTTP_RAW_TRACEPOINTS, HTTP_TRACEPOINTS,
                                  LIBRARY_RAW_TRACEPOINTS, LIBRARY_TRACEPOINTS)
from otel_gpu.probes.attacher import Attacher
from otel_gpu.probes.discovery import known_library_files
from otel_gpu.ratelimit import Stats
from tests.bpf.probe_harness import open_fds


def _tracefs_uprobes() -> list[str]:
    """tracefs-made uprobes of this process (bcc's fallback without a uprobe PMU)."""
    with open("/sys/kernel/tracing/uprobe_events") as f:
        return [line for line in f if f"bcc_{os.getpid()}" in line]


def _probe_fds() -> tuple[int, int]:
    return open_fds("[perf_event]"), open_fds("bpf_link")


@pytest.mark.parametrize("links", ["multi", "perf"])
def test_detach_all_closes_every_probe_before_returning(links):
    from otel_gpu.probes.source import ProgramOptions, load
    from otel_gpu.probes.uprobe_links import choose
    perf_before, links_before = _probe_fds()
    bpf = load(ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE))
    stats = Stats()
    attacher = Attacher(bpf, stats, uprobes=choose(bpf, links))
    # Two files are enough to plant every kind of probe (perf events detach slowly: ~0.1 s each).
    targets = known_library_files(site_dirs=site.getsitepackages())[:2]
    assert targets, "no CUDA runtime or libssl file found to probe"
    probes = sum(attacher.attach(t) for t in targets)
    tracepoints = len(bpf.tracepoint_fds)
    assert probes >= 20 and tracepoints == len(HTTP_TRACEPOINTS + LIBRARY_TRACEPOINTS), bpf.tracepoint_fds
    perf, link = _probe_fds()
    raw = len(bpf.raw_tracepoint_fds)  # links: every syscall's entry and exit, graph_probes.c's process exit
    # (the time split's sched_switch: not in a program built with ProgramOptions' defaults)
    assert raw == len(HTTP_RAW_TRACEPOINTS + GRAPH_RAW_TRACEPOINTS + LIBRARY_RAW_TRACEPOINTS), bpf.raw_tracepoint_fds
    assert (perf - perf_before, link - links_before) == \
        ((tracepoints, probes + raw) if links == "multi" else (probes + tracepoints, raw))

    attacher.detach_all(timeout=300)

    assert _probe_fds() == (perf_before, links_before), "probes still open after detach_all"
    assert attacher.closer.pending() == 0
    assert bpf.uprobe_fds == {} and bpf.tracepoint_fds == {} and bpf.num_open_uprobes() == 0
    assert _tracefs_uprobes() == []
    assert "probe_detach_failed" not in stats.snapshot()
