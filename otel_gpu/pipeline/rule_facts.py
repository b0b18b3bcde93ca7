"""What the attribution rules (pipeline/rules.py) read: the facts of one call (CallFacts)
or of held calls settling (SettleFacts). A fact is computed when a rule first reads it,
once (the hot path: a call is decided by the first rules that apply)."""
from __future__ import annotations

from typing import Callable, NamedTuple


class CallFacts:
    """One call of process `p` (a CudaCall or CallAggregate; for a KernelRollup, ev is
    None and no request is open) made at `ts`. `open`: the requests open at the call
    (begun); `unit`: the tracked execution unit it was made in (pipeline/contexts.py
    Node) or None, with `owner`, the request bound to it or to an ancestor; `groups`:
    p -> the requests open in its related processes.
    The thread facts (`on_thread`, `broken`) are set for a call made in no unit, the only
    calls the thread rules see (the unit rules decide every call made in one): None
    otherwise, so a rule reading them out of place fails loudly. The rarer facts are
    computed when a rule reads them."""
    __slots__ = ("p", "ev", "ts", "open", "unit", "owner", "aggregate", "on_thread", "broken", "_groups",
                 "_sole")

    def __init__(self, p, ev, ts: int, open_requests: list, unit, owner, groups: Callable,
                 aggregate: bool = False) -> None:
        self.p, self.ev, self.ts, self.open, self.unit, self.owner = p, ev, ts, open_requests, unit, owner
        self._groups, self.aggregate, self._sole = groups, aggregate, False
        if unit is None and ev is not None:
            tid = ev.tid
            if open_requests is p.open:  # all of them: the process's index by thread has its own
                self.on_thread = list(p.open_on.get(tid, ()))
            else:
                self.on_thread = [r for r in open_requests if r.tid == tid]
            self.broken = tid in p.broken  # the thread also serves a connection no session can follow
        else:
            self.on_thread = self.broken = None

    @property
    def unit_cands(self) -> tuple:
        """The open requests that have not bound a unit yet: they may own `unit`."""
        return self.p.contexts.candidates()

    @property
    def group(self) -> list:
        return begun(self._groups(self.p), self.ts)

    @property
    def hands_off(self) -> bool:
        return self.p.contexts.hands_off(self.ev.ctx)

    @property
    def sole(self):
        """The one request thread.held or process.one would give the call: the one open
        request its thread read, or the process's one open request while the thread read
        none and holds no half-read head."""
        if self._sole is False:
            on, self._sole = self.on_thread, None
            if self.broken:
                pass
            elif len(on) == 1:
                self._sole = on[0]
            elif not on and len(self.open) == 1 and self.ev.tid not in self.p.partial_heads:
                self._sole = self.open[0]
        return self._sole

    @property
    def handler_pair(self) -> bool:
        """A gRPC handler thread's call (pipeline/handlers.py): calls the kernel counted
        are never held for one, nor calls of a process with untracked connections."""
        return not self.aggregate and not self.p.untracked and any(r.head.multiplexed for r in self.open) \
            and self.p.handlers.pair_of_call(self.ev, self.open)

    @property
    def thread_or_open(self) -> list:
        return self.on_thread or list(self.open)


class SettleFacts(NamedTuple):
    """Held calls settling: their policy's name, the owner it proved (or None), the
    candidates that could still own them (`links`), and their process."""
    policy: str
    owner: object
    links: list
    p: object


def begun(open_requests: list, ts: int) -> list:
    """The open requests that had begun by `ts`, a call's time: records of different CPUs
    come out of the ring buffer out of time order, so a request's head read on another
    CPU can come before a call made earlier (by microseconds; by milliseconds on a
    starved host). Such a request is no owner or candidate of that call."""
    for r in open_requests:
        if r.start_ns > ts:
            return [r for r in open_requests if r.start_ns <= ts]
    return open_requests
