"""Stitches socket and CUDA records into requests, by process, thread and execution unit.

The Stitcher holds the state of every traced process (Proc: its connections, open
requests, windows, execution units) and dispatches each record to its two halves:
pipeline/connections.py (the HTTP half: connections, protocol sessions, requests opened
and finished) and pipeline/attribution.py (the CUDA half: where each call goes, a
request or a window of its process: ambiguous, shared, outside). A thread serving a
connection no session can follow gives no thread/process attribution, nor does a
process with connections the kernel could not track (its table was full: their requests
are not seen); such a process's spans carry how many it had.

It reads nothing itself: the /proc facts it needs (ports, peers, groups of related
processes, the sockets a process still holds) come as records from the stage before it
(pipeline/proc_facts.py). Time arrives as Tick records: at each, the ambiguous/shared/
outside windows collected so far go out; at the final one (collector stopping), every
open request is closed too."""
from __future__ import annotations

import logging
import random
from typing import Optional

from ..ratelimit import RateLimitedLog, Stats
from ..records import (Accept, CallAggregate, ContextCopy, CudaCall, EV_SOCK_READ, KernelRollup, OpenSockets,
                       ProcessGone, ProcessGroup, ProcessSeen, ProcExit, SockClose, SockIo, Tick, UnitWake)
from .attribution import CallAttribution
from .connections import Connections
from .contexts import ProcessContexts
from .handlers import HandlerPairs
from .model import ATTRIBUTIONS
from .process_state import Conn, Proc
from .protocols.base import SessionConfig
from .rules import RULES
from .steps import BatchSteps
from .threads import ThreadProof

log = logging.getLogger(__name__)


class Stitcher(Connections, CallAttribution):
    def __init__(self, span_budget: int = 256, extra_headers: frozenset = frozenset(),
                 stats: Optional[Stats] = None, rng: Optional[random.Random] = None,
                 sampler=None, quiet_when_idle: bool = False, kernel_bound: Optional[int] = None) -> None:
        self.span_budget = span_budget
        self.extra_headers = extra_headers
        self._session_config = SessionConfig(extra_headers)
        self.stats = stats or Stats()
        self._log = RateLimitedLog(log, self.stats, interval_s=30.0)
        self._rng = rng or random.Random()
        self._sampler = sampler  # pipeline/sampling.py; None: every trace sampled
        self.quiet_when_idle = quiet_when_idle  # sampling.drops_roots(): the collector marks new processes quiet
        self.kernel_bound = kernel_bound  # sampling.kernel_bound(): the kernel's draws decide roots against it
        # An incoming traceparent said "not sampled": the collector may have the kernel decide
        # parents from now on (sampling.bound_once_parents_unsampled).
        self.unsampled_parent_seen = False
        self.quiet: dict[int, bool] = {}  # tgid -> whether all its open requests are unsampled, as changed
        self.procs: dict[int, Proc] = {}
        self.groups: dict[int, Optional[str]] = {}  # tgid -> its group of related processes (ProcessGroup)
        self._serving: dict[int, Proc] = {}  # processes with open requests
        self.attributed = dict.fromkeys(ATTRIBUTIONS, 0)
        self.by_rule = dict.fromkeys((r.name for r in RULES), 0)  # calls by the rule that decided them
        self.steps = BatchSteps()  # shared windows waiting for their members (pipeline/steps.py)

    # --- stage interface -------------------------------------------------------
    def process(self, events: list) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, CudaCall):
                self._on_cuda(ev, out)
            elif isinstance(ev, SockIo):
                if ev.kind == EV_SOCK_READ:
                    self._on_read(ev, out)
                else:
                    self._on_write(ev, out)
            elif isinstance(ev, ContextCopy):
                self._proc(ev.tgid, out).contexts.copied(ev)
            elif isinstance(ev, UnitWake):
                self._proc(ev.tgid, out).contexts.wake(ev)
            elif isinstance(ev, Accept):
                self._on_accept(ev, out)
            elif isinstance(ev, ProcessGroup):
                self.groups[ev.tgid] = ev.key
            elif isinstance(ev, OpenSockets):
                self._audit(ev, out)
            elif isinstance(ev, SockClose):
                self._on_close(ev, out)
            elif isinstance(ev, CallAggregate):
                self._on_aggregate(ev, out)
            elif isinstance(ev, KernelRollup):
                self._on_kernel_rollup(ev, out)
            elif isinstance(ev, ProcExit):
                self._on_exit(ev, out)
            elif isinstance(ev, Tick):
                if ev.final:
                    self._close_all(ev.now_ns, "collector stopped", out)
                for p in self.procs.values():
                    p.contexts.sweep(ev.now_ns, min((r.start_ns for r in p.open), default=None))
                self._flush_windows(out)
                self.steps.tick(ev.now_ns, out, ev.final)
                out.append(ev)
            else:  # not for this stage: passed on (a ProcessSeen tells when its calls are seen from)
                if isinstance(ev, ProcessSeen) and ev.probes_from_ns:
                    self._proc(ev.tgid, []).probes_from_ns = ev.probes_from_ns
                out.append(ev)
        return out

    def state(self) -> dict:
        procs = self.procs.values()
        sizes = {"procs": len(self.procs), "conns": sum(len(p.conns) for p in procs),
                 "conns_untracked": sum(p.untracked for p in procs),
                 "open_requests": sum(len(p.open) for p in procs),
                 "contexts_tracked": 0, "contexts_bound": 0, "pending_calls": 0}
        for k, v in (kv for p in procs for kv in p.contexts.state().items()):
            sizes[k] += v
        sizes.update(self.steps.state())
        sizes["pending_calls"] += sum(p.pairs.held for p in procs)  # held for a handler thread's stream
        return sizes

    def _close_all(self, now_ns: int, reason: str, out: list) -> None:
        """Collector stopping: every open request is finished with an error."""
        for p in list(self.procs.values()):
            for conn in list(p.conns.values()):
                self._drop_conn(p, conn, now_ns, reason, out)
            self._settle(p, p.contexts.drain() + p.pairs.drain())

    # --- processes and connections ----------------------------------------------
    def _proc(self, tgid: int, out: list) -> Proc:
        p = self.procs.get(tgid)
        if p is None:
            p = self.procs[tgid] = Proc(tgid, quiet=self.quiet_when_idle)
            p.contexts = ProcessContexts(tgid, self.span_budget, self.stats, self._log)
            p.pairs = HandlerPairs(tgid, self.stats, self._log)
            p.threads = ThreadProof(tgid, self.span_budget, self.stats, self._log)
            out.append(ProcessSeen(tgid))
        return p

    def _conn(self, p: Proc, fd: int) -> Conn:
        c = p.conns.get(fd)
        if c is None:  # accepted before the collector saw it: peer unknown
            c = p.conns[fd] = Conn(fd)  # (pipeline/proc_facts.py makes an Accept for it first)
        return c

    def _note_quiet(self, p: Proc) -> None:
        """Whether `p` has no sampled request open (and, unless the sampler drops traces
        that start here, some request open), when that changes: the collector tells the
        kernel (bpf/maps.h quiet_procs)."""
        if self._sampler is None:
            return
        quiet = not p.sampled_open and (bool(p.open) or self.quiet_when_idle)
        if quiet != p.quiet:
            p.quiet = self.quiet[p.tgid] = quiet

    def _on_exit(self, ev: ProcExit, out: list) -> None:
        # ProcessGone even for a process never seen here (its calls were only counted
        # in the kernel): the collector still has its BPF entries to drop.
        p = self.procs.pop(ev.tgid, None)
        self.groups.pop(ev.tgid, None)
        if p is not None:
            for c in list(p.conns.values()):
                self._drop_conn(p, c, ev.ts_ns, "process exited", out)
            self._settle(p, p.contexts.drain() + p.pairs.drain())
            self._serving.pop(ev.tgid, None)
            self._flush_process_windows(p, out)
        self.steps.gone(ev.tgid, ev.ts_ns, out)
        out.append(ProcessGone(ev.tgid, ev.comm))

    def _audit(self, ev: OpenSockets, out: list) -> None:
        """Releases connections whose close was never seen (pipeline/proc_facts.py says
        when to look): untracked ones (their I/O is not seen), and, when `everyone`, idle
        tracked ones too (a close lost with a full ring buffer). A connection is gone when
        its fd is no longer the socket it was."""
        p = self.procs.get(ev.tgid)
        for c in list(p.conns.values()) if p is not None else ():
            if c.streams or (c.tracked and not ev.everyone):
                continue  # a request in flight: its close is on its way
            inode = ev.fds.get(c.fd)
            if inode is not None and c.inode in (None, inode):
                c.inode = inode
                continue
            if c.tracked:
                self.stats.add("connection_closes_unseen")
            self._drop_conn(p, c, ev.now_ns, "connection closed (close not seen)", out)
