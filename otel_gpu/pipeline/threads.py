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
(thread.unproven), linked to the requests open when it was made.

This is the `thread` policy of the hold engine (pipeline/held.py): its held calls are
keyed by the request the thread read and watched by that request alone; its finish
settles them (OWNS, or GIVE_UP if its thread was mixed)."""
from __future__ import annotations

from .held import GIVE_UP, OWNS, Holds
from .model import Request


class ThreadProof:
    name = "thread"  # the hold policy (pipeline/rules.py thread.held)

    def __init__(self, holds: Holds) -> None:
        self.holds = holds
        self.reading: dict[int, list[Request]] = {}  # tid -> the open requests whose heads it read
        self.mixed: set[int] = set()     # id(open request) whose thread touched another connection meanwhile

    def opened(self, req: Request) -> None:
        self.reading.setdefault(req.tid, []).append(req)

    def io(self, tid: int, fd: int, serving) -> None:
        """Thread `tid` read or wrote connection `fd` (any connection of the process),
        whose open requests are `serving`."""
        for r in self.reading.get(tid, ()):
            if r.fd != fd:
                self.mixed.add(id(r))
        for r in serving:
            if r.tid != tid:
                self.mixed.add(id(r))

    def hold(self, facts, calls, device: int, open_requests: list) -> None:
        """Holds calls on a thread that read one open request's head (thread.held), for
        that request's proof."""
        (req,) = facts.on_thread
        self.holds.hold(self, id(req), self.holds.cands(open_requests), (req,), calls, device)

    def on_finish(self, group, req: Request) -> str:
        """`req`, the group's one watched candidate, is done: proven if its thread was not mixed."""
        return GIVE_UP if id(req) in self.mixed else OWNS

    def finished(self, req: Request) -> None:
        on = self.reading.get(req.tid)
        if on is not None:
            on[:] = [r for r in on if r is not req]
            if not on:
                del self.reading[req.tid]
        self.mixed.discard(id(req))
