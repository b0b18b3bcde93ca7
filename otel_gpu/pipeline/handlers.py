"""Handler threads of multiplexed servers (gRPC C-core, HTTP/2): which stream a pool
thread's CUDA calls serve, when no Python context the probes saw created can tell.

grpcio runs each RPC's handler on a pool thread in a fresh `contextvars.Context()` (not
a copy: the probes never see it created, so pipeline/contexts.py cannot bind it), while
C-core threads read the connection, and every RPC of a channel target shares one
connection. A *handler pair* is (thread, context address) for a call or write made in
a context that is not tracked, on a thread that is not a context thread and read none
of the requests open (thread-per-connection servers keep the thread rules). Context
addresses are reused at once (CPython's free list: one address served six RPCs on four
threads in one measured run), so a pair is an RPC's handler only while that RPC is open.

The rule (measured on grpcio 1.85 at 8 clients: a handler writes its own stream's
frames when it wins C-core's combiner, for 19-23 of 24 RPCs; the other frames come from
C-core threads, ctx 0):
- bind: a write made by a handler pair whose frames (stream id != 0) all belong to one
  open stream R binds the pair to R from that write (w_R) until R ends, if neither is
  bound yet. A bound pair writing another stream's frames, or a second pair writing
  R-only frames, marks R *conflicted*: C-core wrote someone else's frames from a handler
  thread, so R's binding proves nothing.
- hold: a call the thread rules find ambiguous, made by a handler pair while an HTTP/2
  stream is among the candidates, is held with its candidates (the requests open then).
- settle, when R finishes: a held call of R's pair with R among its candidates is R's
  (task) if R is bound and not conflicted and every other candidate that finished
  before w_R was bound, not conflicted, to another pair. Why: the call's owner is the
  RPC whose context sat at that address on that thread when it was made, an open one.
  If that was not R's context, it was freed before R's was made (before w_R), so its
  RPC finished before w_R; one bound to another pair ran elsewhere. Otherwise the call
  is ambiguous, linked to its candidates, as is a held call whose candidates all
  finished without one taking it.
What the rule assumes and cannot see in the records: each RPC's handler runs in a
context of its own (grpcio's; a pool running several RPCs in one long-lived thread
context breaks it, and is caught only when it writes another stream's frames while
bound); a pair's write with frames of one stream only is its own RPC's (C-core runs the
writing thread's own operation first when it takes the combiner); and an RPC's context
lives until its END_STREAM is written (grpcio's _RPCState holds it until the status
operation completes). Bounded: past MAX_HELD held
calls a process's calls are ambiguous at once, counted (`handler_calls_overflow`).
Calls the kernel counted itself (CallAggregate) are not held: ambiguous as before."""
from __future__ import annotations

import logging
from typing import Optional

from ..ratelimit import RateLimitedLog, Stats
from .held import HeldCalls, Outcome
from .model import Request
from .rules import MAX_HELD, rule, share

STREAM, UNPROVEN = rule("handler.stream"), rule("handler.unproven")


class _Held(HeldCalls):
    """Calls of one pair made while one set of requests was open (one by one: the
    kernel's own counts are not held)."""
    __slots__ = ("pair", "live", "settled")

    def __init__(self, pair: tuple, cands: tuple) -> None:
        super().__init__(cands)
        self.pair, self.live = pair, len(cands)
        self.settled = False


class HandlerPairs:
    def __init__(self, tgid: int, stats: Stats, ratelog: RateLimitedLog, max_held: int = MAX_HELD) -> None:
        self.tgid, self.stats, self._log, self.max_held = tgid, stats, ratelog, max_held
        self.pair_of: dict[int, tuple] = {}      # id(open request) -> its pair
        self.req_of: dict[tuple, Request] = {}   # pair -> the open request it is bound to
        self.bound_at: dict[int, int] = {}       # id(open request) -> when its pair bound (w_R)
        self.conflicted: set[int] = set()        # id(open request)
        # id(finished candidate of a held call) -> (its pair if trusted, else None; its end)
        self.verdict: dict[int, tuple] = {}
        self.index: dict[int, dict] = {}         # id(request) -> {_Held it is a candidate of: None}
        self.last: dict[tuple, _Held] = {}       # pair -> its newest _Held
        self.held = 0

    # --- writes ----------------------------------------------------------------------
    def wrote(self, pair: tuple, streams: frozenset, open_streams: dict, ts_ns: int) -> None:
        """A handler pair's write on a multiplexed connection: `streams`, the stream ids
        its frames carry; open_streams: that connection's stream id -> open Request."""
        if not streams:
            return
        bound = self.req_of.get(pair)
        if bound is not None:
            if any(open_streams.get(s) is not bound for s in streams):
                self._conflict(bound, "a bound handler thread wrote another stream's frames")
            return
        if len(streams) != 1:
            return
        (stream,) = streams
        req = open_streams.get(stream)
        if req is None:
            return
        if id(req) in self.pair_of:  # a second thread/context writes this stream alone
            self._conflict(req, "two handler threads wrote one stream's frames")
            return
        self.pair_of[id(req)] = pair
        self.bound_at[id(req)] = ts_ns
        self.req_of[pair] = req

    def _conflict(self, req: Request, why: str) -> None:
        if id(req) not in self.conflicted:
            self.conflicted.add(id(req))
            self._log.event("handler_binding_conflicts", logging.INFO, "pid %d: %s: its calls are ambiguous",
                            self.tgid, why)

    # --- calls -----------------------------------------------------------------------
    @staticmethod
    def applies(candidates: list) -> bool:
        return any(r.head.multiplexed for r in candidates)

    def hold(self, pair: tuple, cands: list, ev, device: int) -> bool:
        """Holds an ambiguous call of `pair`; False when past the cap (counted)."""
        if self.held >= self.max_held:
            self._log.event("handler_calls_overflow", logging.WARNING,
                            "pid %d: %d CUDA calls of handler threads wait for their stream; more are "
                            "attributed ambiguous at once", self.tgid, self.held)
            return False
        h = self.last.get(pair)
        if h is None or h.settled or len(h.cands) != len(cands) or any(a is not b for a, b in zip(h.cands, cands)):
            h = self.last[pair] = _Held(pair, tuple(cands))
            for c in h.cands:
                self.index.setdefault(id(c), {})[h] = None
        h.add(ev, device, True)
        self.held += 1
        return True

    # --- requests --------------------------------------------------------------------
    def finished(self, req: Request) -> list[Outcome]:
        """`req` is done: the held calls of its pair land on it or become ambiguous; the
        others wait for their other candidates (module docstring)."""
        pair = self.pair_of.pop(id(req), None)
        bound_at = self.bound_at.pop(id(req), 0)
        if pair is not None and self.req_of.get(pair) is req:
            del self.req_of[pair]
        trusted = pair is not None and id(req) not in self.conflicted
        self.conflicted.discard(id(req))
        held = self.index.pop(id(req), {})
        if held:
            self.verdict[id(req)] = (pair if trusted else None, req.end_ns)
        out: list[Outcome] = []
        for h in held:
            if h.settled:
                continue
            h.live -= 1
            if trusted and h.pair == pair and self._others_elsewhere(h, req, pair, bound_at):
                out.append(self._settle(h, req))
                continue
            share([req], len(h.calls), len(h.cands))
            if h.pair == pair or h.live <= 0:  # its pair's calls it cannot prove its, or nobody left
                out.append(self._settle(h, None))
        self._forget()
        return out

    def _others_elsewhere(self, h: _Held, req: Request, pair: tuple, bound_at: int) -> bool:
        """Every other candidate of `h` that finished before `req`'s pair bound was bound,
        trusted, to another pair."""
        for c in h.cands:
            v = self.verdict.get(id(c)) if c is not req else None
            if v is not None and v[1] <= bound_at and (v[0] is None or v[0] == pair):
                return False
        return True

    def drain(self) -> list[Outcome]:
        """Every held call settles now, ambiguous (collector stopping, process gone)."""
        out = [self._settle(h, None) for hs in list(self.index.values()) for h in list(hs) if not h.settled]
        self.index.clear()
        self._forget()
        return out

    def _settle(self, h: _Held, req: Optional[Request]) -> Outcome:
        h.settled = True
        self.held -= len(h.calls)
        if self.last.get(h.pair) is h:
            del self.last[h.pair]
        links: list = []
        if req is None:
            for c in h.cands:
                hs = self.index.get(id(c))
                if hs is not None and hs.pop(h, 0) is None:  # still open: its share now
                    share([c], len(h.calls), len(h.cands))
                links.append(c)
        return h.outcome(STREAM if req is not None else UNPROVEN, req, links)

    def _forget(self) -> None:
        """Verdicts of finished requests no held call needs any more."""
        if not self.index:
            self.verdict.clear()
        elif len(self.verdict) > 4 * len(self.index) + 64:
            live = {id(c) for hs in self.index.values() for h in hs for c in h.cands}
            self.verdict = {k: v for k, v in self.verdict.items() if k in live}
