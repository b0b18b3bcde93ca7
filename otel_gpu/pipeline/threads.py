"""Threads proven to serve one request at a time (pipeline/rules.py thread.*), for calls
made in no execution unit the probes know (C, C++, Rust, Java; a Python thread outside
any tracked context).

A thread that read one open request's head may still run another request's work in
between: a runtime that moves tasks between threads (tokio, virtual threads, .NET's
pool, Go without goroutine reading) or a pool thread that serves many connections. The
records show it when that thread reads or writes another connection while the request
is open, or when the request's own connection is read or written from another thread
(its work moved). So a call the thread rule gives to request R is held until R
finishes: it is R's (thread.one) if R's connection was served by R's thread alone and
that thread touched no other connection while R was open; else ambiguous
(thread.unproven), linked to the requests open when it was made. Held calls
are kept one by one up to the span budget per request, folded after; past MAX_HELD per
process they are ambiguous at once, counted (thread.held_full)."""
from __future__ import annotations

import logging
from typing import Optional

from ..ratelimit import RateLimitedLog, Stats
from ..records import CallAggregate
from .held import HeldCalls, Outcome
from .model import Request
from .rules import MAX_HELD, rule, share

THREAD_ONE, THREAD_UNPROVEN = rule("thread.one"), rule("thread.unproven")


class ThreadProof:
    def __init__(self, tgid: int, keep: int, stats: Stats, ratelog: RateLimitedLog,
                 max_held: int = MAX_HELD) -> None:
        self.tgid, self.keep, self.stats, self._log, self.max_held = tgid, keep, stats, ratelog, max_held
        self.reading: dict[int, list[Request]] = {}  # tid -> the open requests whose heads it read
        self.mixed: set[int] = set()     # id(open request) whose thread touched another connection meanwhile
        self.live: set[int] = set()      # id(open request)
        self.held: dict[int, list[HeldCalls]] = {}  # id(open request) -> its held calls, by candidates
        self.kept: dict[int, int] = {}   # id(open request) -> calls held one by one
        self.entries = 0                 # held calls and folds
        self.pending = 0                 # calls held (folded ones counted one by one)
        self._cands: Optional[tuple] = None  # the open requests, while none opens or finishes

    def opened(self, req: Request) -> None:
        self.reading.setdefault(req.tid, []).append(req)
        self.live.add(id(req))
        self._cands = None

    def io(self, tid: int, fd: int, serving) -> None:
        """Thread `tid` read or wrote connection `fd` (any connection of the process),
        whose open requests are `serving`."""
        for r in self.reading.get(tid, ()):
            if r.fd != fd:
                self.mixed.add(id(r))
        for r in serving:
            if r.tid != tid:
                self.mixed.add(id(r))

    def hold(self, req: Request, ev, device: int, open_requests: list) -> bool:
        """Holds a call the thread rule gives to `req`; False past the cap (counted)."""
        if self.entries >= self.max_held:
            self._log.event("thread_calls_overflow", logging.WARNING,
                            "pid %d: %d CUDA calls wait for their thread's proof; more are attributed "
                            "ambiguous at once", self.tgid, self.pending)
            return False
        if self._cands is None:
            self._cands = tuple(open_requests)
        hs = self.held.setdefault(id(req), [])
        if not hs or hs[-1].cands is not self._cands:
            hs.append(HeldCalls(self._cands))
        kept = self.kept.get(id(req), 0)
        one = kept < self.keep and ev.__class__ is not CallAggregate
        self.kept[id(req)] = kept + one
        entries, calls = hs[-1].add(ev, device, one)
        self.entries += entries
        self.pending += calls
        return True

    def finished(self, req: Request) -> list[Outcome]:
        """`req` is done: its held calls are its own, or ambiguous if its thread was mixed."""
        on = self.reading.get(req.tid)
        if on is not None:
            on[:] = [r for r in on if r is not req]
            if not on:
                del self.reading[req.tid]
        mixed = id(req) in self.mixed
        self.mixed.discard(id(req))
        self.kept.pop(id(req), None)
        out = []
        for h in self.held.pop(id(req), ()):
            self.entries -= h.entries
            self.pending -= h.count
            if not mixed:
                out.append(h.outcome(THREAD_ONE, req, []))
                continue
            share([c for c in h.cands if id(c) in self.live], h.count, len(h.cands))
            out.append(h.outcome(THREAD_UNPROVEN, None, list(h.cands)))
        self.live.discard(id(req))
        self._cands = None
        return out
