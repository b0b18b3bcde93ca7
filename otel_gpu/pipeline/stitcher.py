"""Stitches socket and CUDA records into requests, by process, thread and execution unit.

The Stitcher is made of two halves that share one StitchState (pipeline/process_state.py:
every traced process's connections, open requests, windows, execution units, held
calls), and dispatches each record to one of them: pipeline/connections.py (`http`:
connections, protocol sessions, requests opened and finished) and
pipeline/attribution.py (`calls`: where each call goes by the rules of
pipeline/rules.py, a request or a window of its process: ambiguous, shared, outside). A thread serving a
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
from ..records import (Accept, AggregateRun, ContextCopy, CudaCall, EV_SOCK_READ, GoH2Unit, KernelRollup,
                       OpenSockets, ProcessGone, ProcessGroup, ProcessSeen, ProcExit, SockClose, SockIo, Tick,
                       UnitWake)
from .attribution import CallAttribution
from .connections import Connections
from .process_state import StitchState
from .steps import BatchSteps

log = logging.getLogger(__name__)


class Stitcher:
    def __init__(self, span_budget: int = 256, extra_headers: frozenset = frozenset(),
                 stats: Optional[Stats] = None, rng: Optional[random.Random] = None,
                 sampler=None, quiet_when_idle: bool = False, kernel_bound: Optional[int] = None,
                 root_bound: Optional[int] = None) -> None:
        self.stats = stats or Stats()
        self.s = StitchState(span_budget, self.stats, RateLimitedLog(log, self.stats, interval_s=30.0),
                             quiet_when_idle)
        self.procs = self.s.procs
        self.steps = BatchSteps()  # shared windows waiting for their members (pipeline/steps.py)
        self.calls = CallAttribution(self.s, self.steps)
        self.http = Connections(self.s, self.calls, extra_headers, rng or random.Random(), sampler, kernel_bound,
                                root_bound)
        self.attributed, self.by_rule = self.calls.attributed, self.calls.by_rule

    # --- stage interface -------------------------------------------------------
    def process(self, events: list) -> list:
        out: list = []
        calls, http = self.calls, self.http
        for ev in events:
            if isinstance(ev, CudaCall):
                calls.on_cuda(ev, out)
            elif isinstance(ev, SockIo):
                if ev.kind == EV_SOCK_READ:
                    http.on_read(ev, out)
                else:
                    http.on_write(ev, out)
            elif isinstance(ev, ContextCopy):
                self.s.proc(ev.tgid, out).contexts.copied(ev)
            elif isinstance(ev, UnitWake):
                self.s.proc(ev.tgid, out).contexts.wake(ev)
            elif isinstance(ev, GoH2Unit):
                http.on_go_h2(ev, out)
            elif isinstance(ev, Accept):
                http.on_accept(ev, out)
            elif isinstance(ev, ProcessGroup):
                self.s.groups[ev.tgid] = ev.key
            elif isinstance(ev, OpenSockets):
                self._audit(ev, out)
            elif isinstance(ev, SockClose):
                http.on_close(ev, out)
            elif isinstance(ev, AggregateRun):
                calls.on_run(ev, out)
            elif isinstance(ev, KernelRollup):
                calls.on_kernel_rollup(ev, out)
            elif isinstance(ev, ProcExit):
                self._on_exit(ev, out)
            elif isinstance(ev, Tick):
                if ev.final:
                    self._close_all(ev.now_ns, "collector stopped", out)
                for p in self.procs.values():
                    p.contexts.sweep(ev.now_ns, min((r.start_ns for r in p.open), default=None))
                calls.flush_windows(out)
                self.steps.tick(ev.now_ns, out, ev.final)
                out.append(ev)
            else:  # not for this stage: passed on (a ProcessSeen tells when its calls are seen from)
                if isinstance(ev, ProcessSeen) and ev.probes_from_ns:
                    self.s.proc(ev.tgid, []).probes_from_ns = ev.probes_from_ns
                out.append(ev)
        return out

    def state(self) -> dict:
        procs = self.procs.values()
        sizes = {"procs": len(self.procs), "conns": sum(len(p.conns) for p in procs),
                 "conns_untracked": sum(p.untracked for p in procs),
                 "open_requests": sum(len(p.open) for p in procs),
                 "contexts_tracked": 0, "contexts_bound": 0,
                 "pending_calls": sum(p.holds.held for p in procs)}  # held until their owner is known
        for k, v in (kv for p in procs for kv in p.contexts.state().items()):
            sizes[k] += v
        sizes.update(self.steps.state())
        return sizes

    def _close_all(self, now_ns: int, reason: str, out: list) -> None:
        """Collector stopping: every open request is finished with an error."""
        for p in list(self.procs.values()):
            for conn in list(p.conns.values()):
                self.http.drop_conn(p, conn, now_ns, reason, out)
            self.calls.drain(p)

    def _on_exit(self, ev: ProcExit, out: list) -> None:
        # ProcessGone even for a process never seen here (its calls were only counted
        # in the kernel): the collector still has its BPF entries to drop.
        p = self.procs.pop(ev.tgid, None)
        self.s.groups.pop(ev.tgid, None)
        if p is not None:
            for c in list(p.conns.values()):
                self.http.drop_conn(p, c, ev.ts_ns, "process exited", out)
            self.calls.drain(p)
            self.s.serving.pop(ev.tgid, None)
            self.calls.flush_process_windows(p, out)
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
            self.http.drop_conn(p, c, ev.now_ns, "connection closed (close not seen)", out)
