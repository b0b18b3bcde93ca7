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
operation completes).

This is the `handler` policy of the hold engine (pipeline/held.py): its held calls are
keyed by their pair and watched by every candidate; R's finish settles its pair's held
calls (OWNS, or GIVE_UP), another pair's wait for their other candidates (PASS). Calls
the kernel counted itself (CallAggregate) are not held: ambiguous as before."""
from __future__ import annotations

import logging

from ..ratelimit import RateLimitedLog
from .held import GIVE_UP, OWNS, PASS, Holds
from .model import Request


class HandlerPairs:
    name = "handler"  # the hold policy (pipeline/rules.py handler.held)

    def __init__(self, tgid: int, holds: Holds, contexts, ratelog: RateLimitedLog) -> None:
        self.tgid, self.holds, self.contexts, self._log = tgid, holds, contexts, ratelog
        self.pair_of: dict[int, tuple] = {}      # id(open request) -> its pair
        self.req_of: dict[tuple, Request] = {}   # pair -> the open request it is bound to
        self.bound_at: dict[int, int] = {}       # id(open request) -> when its pair bound (w_R)
        self.conflicted: set[int] = set()        # id(open request)
        # id(finished candidate of a held call) -> (its pair if trusted, else None; its end)
        self.verdict: dict[int, tuple] = {}
        self.ending: dict[int, tuple] = {}       # id(request finishing) -> (pair, trusted, w_R)

    def pair_of_call(self, ev, requests) -> bool:
        """Made in a Python context the probes never saw created, on a thread that never
        ran a tracked one and read none of `requests` (a call or a write)."""
        return bool(ev.ctx) and ev.ctx not in self.contexts.nodes and ev.tid not in self.contexts.threads \
            and all(r.tid != ev.tid for r in requests)

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
    def hold(self, facts, calls, device: int, open_requests: list) -> None:
        """Holds calls of a handler pair, (thread, context), for its stream's proof (handler.held)."""
        cands = self.holds.cands(open_requests)
        self.holds.hold(self, (facts.ev.tid, facts.ev.ctx), cands, cands, calls, device)

    # --- requests --------------------------------------------------------------------
    def on_finish(self, group, req: Request) -> str:
        """`req`, a candidate of `group`, is done: the held calls of its pair are its or
        nobody's provably; another pair's wait for their other candidates."""
        pair, trusted, bound_at = self._ending(req)
        if group.key != pair:
            return PASS
        return OWNS if trusted and self._others_elsewhere(group, req, pair, bound_at) else GIVE_UP

    def _ending(self, req: Request) -> tuple:
        """(its pair, whether its binding is trusted, w_R) once per finish; remembered
        for the held calls it was a candidate of (verdict)."""
        e = self.ending.get(id(req))
        if e is None:
            e = self.ending[id(req)] = self._take(req)
            pair, trusted, _ = e
            self.verdict[id(req)] = (pair if trusted else None, req.end_ns)
        return e

    def _take(self, req: Request) -> tuple:
        """Takes `req`'s pair state: (its pair, whether its binding is trusted, w_R)."""
        pair = self.pair_of.pop(id(req), None)
        bound_at = self.bound_at.pop(id(req), 0)
        if pair is not None and self.req_of.get(pair) is req:
            del self.req_of[pair]
        trusted = pair is not None and id(req) not in self.conflicted
        self.conflicted.discard(id(req))
        return pair, trusted, bound_at

    def _others_elsewhere(self, group, req: Request, pair: tuple, bound_at: int) -> bool:
        """Every other candidate of `group` that finished before `req`'s pair bound was
        bound, trusted, to another pair."""
        for c in group.cands:
            v = self.verdict.get(id(c)) if c is not req else None
            if v is not None and v[1] <= bound_at and (v[0] is None or v[0] == pair):
                return False
        return True

    def finished(self, req: Request) -> None:
        """After the held calls were told: its pair's state goes, verdicts no held call
        needs any more too."""
        if self.ending.pop(id(req), None) is None:
            self._take(req)
        if not self.verdict:
            return
        n = self.holds.count(self.name)
        if not n:
            self.verdict.clear()
        elif len(self.verdict) > 4 * n + 64:
            live = {id(c) for g in self.holds.groups(self.name) for c in g.cands}
            self.verdict = {k: v for k, v in self.verdict.items() if k in live}
