"""Attaches the CUDA (and Python-context) probe table to each discovered file: once
per file for every process that maps it, or, with --pid/--exe, once per file and
selected process (the link's or perf uprobe's pid: the kernel plants no breakpoint in
other processes mapping the file and they never trap). How each probe is planted
(uprobe_multi link or perf-event uprobe) is probes/uprobe_links.py's. A probe that
fails to attach (a transient error, another tool's incompatible registration on the
same function) is tried again at later scans, with backoff, until it attaches or
RETRY_TRIES are spent. Detaches a process's own probes when it goes, and everything
on shutdown."""
from __future__ import annotations

import logging
import os
import resource
import time
from collections import Counter
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..cuda_calls import CALLS, Category, TLS
from .rows import UprobeRow, rows_for
from .closer import ProbeCloser
from .discovery import ProbeTarget
from .elf_init import init_address
from .prologue import SINGLE_STEP_COST, emulated, entry_code
from .uprobe_links import LinkFd, PerfUprobes

log = logging.getLogger(__name__)

FD_HEADROOM = 256  # descriptors kept for sockets and files when sizing the probe limit
LOAD_PROBE = "load"  # in place of a pid in `attached`: a file's DT_INIT probe, for every process
# A failed probe is tried again RETRY_FIRST_S after, the wait doubling up to RETRY_MAX_S,
# RETRY_TRIES times (~6 minutes in all); then it stays failed, counted and logged.
RETRY_FIRST_S, RETRY_MAX_S, RETRY_TRIES = 1.0, 60.0, 10
LINKS_CLOSE_S = 2.0  # stopping: the wait for every link's close (~0.1 s for hundreds, measured)
# Without these a process's kernels go uncounted: `ready` says so (collector.start).
LAUNCH_SYMBOLS = frozenset(s for c in CALLS if c.category is Category.LAUNCH for s in c.symbols)


@dataclass
class Failure:
    row: UprobeRow
    error: str
    retries: int = 0      # attempts after the first
    next_at: float = 0.0  # time.monotonic() of the next attempt; inf: given up


@dataclass
class Attached:
    target: ProbeTarget
    events: list   # the probes' handles (uprobe_links: link fds or bcc's event names)
    symbols: list  # rows attached, for by_symbol
    failures: dict = field(default_factory=dict)  # symbol -> Failure, while it is not attached


@dataclass(frozen=True)
class ProbeCounts:
    """A pipeline record (pushed at each flush) for the metrics stage: by function, how
    many files (or file and process pairs) it is attached to, and how many it failed on."""
    attached: dict
    failed: dict


class Attacher:
    def __init__(self, bpf, stats, closer=None, clock: Callable[[], float] = time.monotonic,
                 uprobes=None) -> None:
        self.bpf = bpf
        self.stats = stats
        self.uprobes = uprobes or PerfUprobes(bpf)  # uprobe_links.choose() decides for the collector
        self.clock = clock
        self.closer = closer or ProbeCloser(bpf, stats)  # detaches off the loop (~0.1 s a probe), many at once
        # (file key, pid or None for every process) -> what is attached there
        self.attached: dict[tuple, Attached] = {}
        self.probe_count = 0
        self.attach_s = 0.0  # time spent attaching, in all (status, `ready`, the bench)
        _raise_probe_limits()
        # By function, for `otel-gpu status` and the probe metrics: files (or file and
        # process pairs) each is attached to; those it failed on and is not attached to now.
        self.by_symbol: Counter[str] = Counter()
        self.failed: Counter[str] = Counter()
        # Functions probed at an instruction x86 single-steps (prologue.py), by file.
        self.single_stepped: dict[str, set] = {}

    def attach(self, target: ProbeTarget, pid: Optional[int] = None) -> int:
        """Attaches every row that the file defines, for every process mapping it
        (pid None) or for process `pid` only; returns how many probes. Called again
        for a file already probed, it retries the rows that failed there, when due."""
        known = self.attached.get((target.key, pid))
        if known is not None:
            return self._retry(known, pid) if known.failures else 0
        t0 = time.monotonic()
        try:
            return self._attach_new(target, pid)
        finally:
            self.attach_s += time.monotonic() - t0

    def _attach_new(self, target: ProbeTarget, pid: Optional[int]) -> int:
        events, symbols, failures = [], [], []
        rows = rows_for(target.kind, target.addresses)
        self.uprobes.prepare([fn for row in rows for fn in (row.entry, row.ret) if fn])
        for row in rows:
            new, error = self._attach_row(target, row, pid)
            events += new
            if error is None:
                symbols.append(row.symbol)
            elif "could not determine address" in error:  # absent in this build: normal for _ptsz
                log.debug("no %s in %s", row.symbol, target.path)
            else:
                failures.append((row, error))
        if pid is not None and not os.path.exists(target.path):  # the process left meanwhile: not a failure
            self._detach_events(events)
            log.debug("pid %d exited while its probes were attached", pid)
            return 0
        a = self.attached[(target.key, pid)] = Attached(target, events, symbols)
        now = self.clock()
        for row, error in failures:
            self.failed[row.symbol] += 1
            self.stats.add("probe_attach_failed")
            a.failures[row.symbol] = Failure(row, error, next_at=now + RETRY_FIRST_S)
            log.warning("cannot attach %s to %s in %s%s: %s (retrying in %.0f s)", row.entry, row.symbol,
                        target.path, _for(pid), error, RETRY_FIRST_S)
        self.by_symbol.update(symbols)
        self.probe_count += len(events)
        log.info("attached %d CUDA probes to %s%s", len(events), target.path,
                 "" if pid is None else f" for pid {pid} only")
        return len(events)

    def _attach_row(self, target: ProbeTarget, row: UprobeRow, pid: Optional[int]) -> tuple[list, Optional[str]]:
        """One row's probes, all or none: (handles, None) or ([], the error)."""
        events, error = [], None
        addr = dict(target.addresses).get(row.symbol)  # a function a stripped file names elsewhere
        where = {"symbol": row.symbol} if addr is None else {"addr": addr}
        try:
            events += self.uprobes.attach(target.path, row.entry, pid=pid, **where)
            if row.ret:
                events += self.uprobes.attach(target.path, row.ret, ret=True, pid=pid, **where)
        except Exception as e:
            error = str(e) or type(e).__name__
        else:
            self._note_single_step(target, row.symbol, addr)
        if error is not None and events:  # the entry attached, its return probe did not
            self._detach_events(events)
            events = []
        return events, error

    def _note_single_step(self, target: ProbeTarget, symbol: str, addr: Optional[int]) -> None:
        """Says once per file and function when its probe sits on an instruction x86
        single-steps (each call then pays two exceptions: prologue.SINGLE_STEP_COST)."""
        files = self.single_stepped.setdefault(symbol, set())
        if target.path in files or emulated(entry_code(target.path, symbol, addr)):
            return
        files.add(target.path)
        log.warning("%s in %s: its probe is single-stepped (its first instruction is not one x86 uprobes "
                    "emulate): %s", symbol, target.path, SINGLE_STEP_COST)

    def _retry(self, a: Attached, pid: Optional[int]) -> int:
        """The failed rows of `a` whose backoff is over, tried again; returns probes added."""
        now, added = self.clock(), 0
        for symbol, f in list(a.failures.items()):
            if now < f.next_at:
                continue
            if pid is not None and not os.path.exists(a.target.path):  # leaving: detach() follows
                return added
            self.stats.add("probe_attach_retried")
            f.retries += 1
            events, error = self._attach_row(a.target, f.row, pid)
            if error is None:
                del a.failures[symbol]
                a.events += events
                a.symbols.append(symbol)
                self.by_symbol[symbol] += 1
                self.failed -= Counter({symbol: 1})
                self.probe_count += len(events)
                added += len(events)
                log.info("attached %s to %s in %s%s at retry %d", f.row.entry, symbol, a.target.path,
                         _for(pid), f.retries)
                continue
            self.stats.add("probe_attach_failed")
            f.error = error
            if f.retries >= RETRY_TRIES:
                f.next_at = float("inf")
                log.warning("giving up on %s in %s%s after %d retries: %s", symbol, a.target.path, _for(pid),
                            f.retries, error)
            else:
                wait = min(RETRY_MAX_S, RETRY_FIRST_S * 2 ** f.retries)
                f.next_at = now + wait
                log.info("cannot attach %s to %s in %s%s at retry %d: %s (next in %.0f s)", f.row.entry, symbol,
                         a.target.path, _for(pid), f.retries, error, wait)
        return added

    def counts(self) -> ProbeCounts:
        return ProbeCounts(dict(self.by_symbol), dict(self.failed))

    def missing_launches(self) -> list[tuple[str, str, str]]:
        """(symbol, file, error) of every launch probe not attached because it failed."""
        return [(s, a.target.path, f.error) for a in self.attached.values()
                for s, f in a.failures.items() if s in LAUNCH_SYMBOLS]

    def attach_load_probe(self, target: ProbeTarget) -> bool:
        """One uprobe on the library's DT_INIT for every process (bpf/library_probes.c):
        it fires once as a process loads the file, never on its calls. False when the
        file has no DT_INIT (then its processes are found by the /proc scan only)."""
        if target.kind == TLS:
            return False  # loading libssl says nothing about CUDA: its processes come from the scan
        key = (target.key, LOAD_PROBE)
        if key in self.attached:
            return True
        addr = init_address(target.path)
        if addr is None:
            log.debug("no DT_INIT in %s: found by the /proc scan only", target.path)
            self.attached[key] = Attached(target, [], [])
            return False
        try:
            events = self.uprobes.attach(target.path, "cuda_library_loaded", addr=addr)
        except Exception as e:
            self.stats.add("probe_attach_failed")
            log.warning("cannot attach the load probe to %s: %s", target.path, e)
            return False
        self.attached[key] = Attached(target, events, [])
        self.probe_count += len(events)
        return True

    def pids(self) -> set:
        """Processes that have probes of their own."""
        return {pid for _, pid in self.attached if pid is not None and pid != LOAD_PROBE}

    def files(self) -> int:
        return len({key[:2] for key, pid in self.attached if pid != LOAD_PROBE})  # (st_dev, st_ino): a file's parts once

    def detach(self, pid: int) -> int:
        """Detaches process `pid`'s own probes (it exited, or is no longer selected);
        returns how many."""
        return sum(self.detach_target(key, pid) for key, p in list(self.attached) if p == pid)

    def detach_target(self, key: tuple, pid: int) -> int:
        """Detaches the probes of one target (by its key) for process `pid`; how many."""
        a = self.attached.pop((key, pid), None)
        if a is None:
            return 0
        self.by_symbol -= Counter(a.symbols)
        self.failed -= Counter(a.failures.keys())
        self.probe_count -= len(a.events)
        return self._detach_events(a.events)

    def links_closed(self) -> bool:
        """Every detached link closed: their programs run no more (a perf-event uprobe
        stops as it is detached)."""
        return self.closer.wait_links(0)

    def _detach_events(self, events: list) -> int:
        return self.closer.detach(events)

    def disable_all(self) -> None:
        """Every probe disabled at once (nothing more is recorded), their closes queued
        on the closer's threads (bcc's cleanup would close them one after another: ~0.1 s
        each). Links stop only as they close: waited for, LINKS_CLOSE_S at most. The ring
        buffer and maps stay readable until detach_all()."""
        links = [ev for a in self.attached.values() for ev in a.events if isinstance(ev, LinkFd)]
        self.closer.detach_all(links)
        self.attached.clear()
        if not self.closer.wait_links(LINKS_CLOSE_S):
            log.warning("uprobe links still closing after %.0f s: calls made until they close are not counted",
                        LINKS_CLOSE_S)

    def detach_all(self, timeout: float = 60) -> None:
        """disable_all() if not done, the closes waited for, then bcc's cleanup frees the
        programs and maps."""
        self.disable_all()
        if not self.closer.wait(timeout):
            log.warning("%d probes still closing after %.0f s", self.closer.pending(), timeout)
        self.bpf.cleanup()


def _for(pid: Optional[int]) -> str:
    return "" if pid is None else f" for pid {pid}"


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
