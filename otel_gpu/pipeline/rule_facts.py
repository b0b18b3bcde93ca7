"""What the attribution rules (pipeline/rules.py) read: the facts of one call (CallFacts)
or of held calls settling (SettleFacts). A fact is computed when a rule first reads it
(the hot path: most calls are decided by the first rules)."""
from __future__ import annotations

from functools import cached_property
from typing import Callable, NamedTuple, Optional


class UnitFacts(NamedTuple):
    """A call made in a tracked execution unit (pipeline/contexts.py ProcessContexts.call)."""
    node: object
    owner: object  # the request bound to it or to an ancestor, or None
    cands: tuple   # the open requests that have not bound a unit yet (may own it)


class CallFacts:
    """One call of process `p` (a CudaCall or CallAggregate; for a KernelRollup, ev is
    None and no request is open). `open`: the requests open at the call (begun);
    `unit`: UnitFacts or None (no tracked unit: the thread rules); `group_of`: the
    requests open in related processes."""

    def __init__(self, p, ev, open_requests: list, unit: Optional[UnitFacts],
                 group_of: Callable[[], list], aggregate: bool = False) -> None:
        self.p, self.ev, self.open, self.unit = p, ev, open_requests, unit
        self._group_of, self.aggregate = group_of, aggregate

    @cached_property
    def group(self) -> list:
        return self._group_of()

    @cached_property
    def hands_off(self) -> bool:
        return self.p.contexts.hands_off(self.ev.ctx)

    @cached_property
    def broken(self) -> bool:
        """The thread also serves a connection no session can follow."""
        return self.ev.tid in self.p.broken

    @cached_property
    def on_thread(self) -> list:
        tid = self.ev.tid
        return [r for r in self.open if r.tid == tid]

    @cached_property
    def sole(self):
        """The one request thread.held or process.one would give the call: the one open
        request its thread read, or the process's one open request while the thread read
        none and holds no half-read head."""
        if self.broken:
            return None
        on = self.on_thread
        if len(on) == 1:
            return on[0]
        if not on and len(self.open) == 1 and self.ev.tid not in self.p.partial_heads:
            return self.open[0]
        return None

    @property
    def sole_on_thread(self) -> bool:
        return not self.broken and len(self.on_thread) == 1

    @cached_property
    def handler_pair(self) -> bool:
        """A gRPC handler thread's call (pipeline/handlers.py): calls the kernel counted
        are never held for one, nor calls of a process with untracked connections."""
        return not self.aggregate and not self.p.untracked and any(r.head.multiplexed for r in self.open) \
            and self.p.handlers.pair_of_call(self.ev, self.open)

    @property
    def owner(self):
        return self.unit.owner

    @property
    def unit_cands(self) -> tuple:
        return self.unit.cands

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
