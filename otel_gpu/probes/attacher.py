"""Attaches the CUDA (and Python-context) probe table to each discovered file: once
per file for every process that maps it, or, with --pid/--exe, once per file and
selected process (bcc's pid: a per-process perf uprobe, so the kernel plants no
breakpoint in other processes mapping the file and they never trap). Detaches a
process's own probes when it goes, and everything on shutdown."""
from __future__ import annotations

import logging
import os
import resource
from collections import Counter
from dataclasses import dataclass
from typing import Optional

from .closer import ProbeCloser
from .discovery import ProbeTarget
from .table import rows_for

log = logging.getLogger(__name__)

FD_HEADROOM = 256  # descriptors kept for sockets and files when sizing the probe limit


@dataclass
class Attached:
    target: ProbeTarget
    events: list   # bcc's event names (keys of bpf.uprobe_fds), one per probe
    symbols: list  # rows attached, for by_symbol


class Attacher:
    def __init__(self, bpf, stats, closer=None) -> None:
        self.bpf = bpf
        self.stats = stats
        self.closer = closer or ProbeCloser(bpf, stats)  # detaches off the loop (~0.1 s a probe)
        # (file key, pid or None for every process) -> what is attached there
        self.attached: dict[tuple, Attached] = {}
        self.probe_count = 0
        _raise_probe_limits()
        # By function, for `otel-gpu status`: files each is attached to; failed attaches.
        self.by_symbol: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()

    def attach(self, target: ProbeTarget, pid: Optional[int] = None) -> int:
        """Attaches every row that the file defines, for every process mapping it
        (pid None) or for process `pid` only; returns how many probes."""
        if (target.key, pid) in self.attached:
            return 0
        before = set(self.bpf.uprobe_fds)
        symbols, failures = [], []
        for row in rows_for(target.kind):
            try:
                self.bpf.attach_uprobe(name=target.path.encode(), sym=row.symbol.encode(),
                                       fn_name=row.entry.encode(), pid=-1 if pid is None else pid)
                if row.ret:
                    self.bpf.attach_uretprobe(name=target.path.encode(), sym=row.symbol.encode(),
                                              fn_name=row.ret.encode(), pid=-1 if pid is None else pid)
                symbols.append(row.symbol)
            except Exception as e:
                if "could not determine address" in str(e):  # absent in this build: normal for _ptsz
                    log.debug("no %s in %s", row.symbol, target.path)
                else:
                    failures.append((row, e))
        events = [ev for ev in self.bpf.uprobe_fds if ev not in before]
        if pid is not None and not os.path.exists(target.path):  # the process left meanwhile: not a failure
            self._detach_events(events)
            log.debug("pid %d exited while its probes were attached", pid)
            return 0
        for row, e in failures:
            self.failed[row.symbol] += 1
            self.stats.add("probe_attach_failed")
            log.warning("cannot attach %s to %s in %s%s: %s", row.entry, row.symbol, target.path,
                        "" if pid is None else f" for pid {pid}", e)
        self.attached[(target.key, pid)] = Attached(target, events, symbols)
        self.by_symbol.update(symbols)
        self.probe_count += len(events)
        log.info("attached %d CUDA probes to %s%s", len(events), target.path,
                 "" if pid is None else f" for pid {pid} only")
        return len(events)

    def pids(self) -> set:
        """Processes that have probes of their own."""
        return {pid for _, pid in self.attached if pid is not None}

    def files(self) -> int:
        return len({key for key, _ in self.attached})

    def detach(self, pid: int) -> int:
        """Detaches process `pid`'s own probes (it exited, or is no longer selected);
        returns how many."""
        n = 0
        for key in [k for k in self.attached if k[1] == pid]:
            a = self.attached.pop(key)
            n += self._detach_events(a.events)
            self.by_symbol -= Counter(a.symbols)
            self.probe_count -= len(a.events)
        return n

    def _detach_events(self, events: list) -> int:
        return self.closer.detach(events)

    def detach_all(self, timeout: float = 60) -> None:
        # bcc's cleanup detaches every uprobe and tracepoint it still holds; the closer
        # finishes those of processes that went before.
        self.bpf.cleanup()
        self.attached.clear()
        if not self.closer.wait(timeout):
            log.warning("%d uprobes still closing after %.0f s", self.closer.pending(), timeout)


def _raise_probe_limits() -> None:
    """Per-process probes are one perf event (one descriptor) each: ~27 per Python
    CUDA process. bcc refuses more than 1000 open probes unless BCC_PROBE_LIMIT says
    otherwise, and the soft descriptor limit is often 1024: raise both as far as the
    hard limit allows. Attaches past them fail, counted (probe_attach_failed)."""
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if hard == resource.RLIM_INFINITY or hard > soft:
        try:
            resource.setrlimit(resource.RLIMIT_NOFILE, (hard, hard))
            soft = hard
        except (ValueError, OSError) as e:
            log.debug("cannot raise the descriptor limit to %s: %s", hard, e)
    limit = soft if soft != resource.RLIM_INFINITY else 1 << 20
    os.environ.setdefault("BCC_PROBE_LIMIT", str(max(1000, limit - FD_HEADROOM)))
