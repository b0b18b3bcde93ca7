"""Calls held until their owner is known (pipeline/rules.py HELD), the one container the
hold engines share: execution units waiting for a binding (pipeline/contexts.py),
handler threads waiting for their stream (pipeline/handlers.py) and threads waiting
for proof that they served one request alone (pipeline/threads.py). Each keeps calls
one by one while the engine says so (what a span can show) and folds the rest by
(call, detail), so counts always add up; it settles into one Outcome."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..records import CallAggregate
from .model import Request, RollupAgg, busy_end
from .rules import Rule


@dataclass
class Outcome:
    """Held calls whose owner is now known (`rule` says how): `request`, or nobody,
    linked to `links` (ambiguous: the candidates that could still own them) or to none."""
    rule: Rule
    request: Optional[Request]
    links: list
    calls: list                                # (call, device)
    folds: list = field(default_factory=list)  # [RollupAgg, device, busy end]
    count: int = 0
    start_ns: int = 0

    @property
    def attribution(self) -> str:
        return self.rule.attribution


class HeldCalls:
    """Calls made while one set of requests (`cands`) could own them."""
    __slots__ = ("cands", "calls", "folds", "count", "first_ts")

    def __init__(self, cands: tuple) -> None:
        self.cands = cands
        self.calls: list = []  # (call, device)
        self.folds: dict = {}  # (call, detail[, id]) -> [RollupAgg, device, busy end]
        self.count = 0
        self.first_ts = 0

    def add(self, ev, device: int, one_by_one: bool) -> tuple[int, int]:
        """Holds a call (or a CallAggregate: a fold of its own); returns the entries it
        added (0 when folded into an existing one) and the calls (a CallAggregate's count)."""
        n, added = 1, 1
        if ev.__class__ is CallAggregate:  # calls the kernel counted
            n = ev.count
            agg = RollupAgg(ev.call, ev.detail, n, ev.bytes, ev.duration_ns, ev.ts_ns, ev.last_ts, ev.last_end_ts)
            self.folds[(ev.call, ev.detail, id(agg))] = [agg, device, ev.last_end_ts]
        elif one_by_one:
            self.calls.append((ev, device))
        else:  # past what any span could show one by one: folded by (call, detail)
            detail, nbytes, duration = ev.amounts()
            fold = self.folds.get((ev.call, detail))
            if fold is None:
                fold = self.folds[(ev.call, detail)] = [RollupAgg(ev.call, detail), device, 0]
            else:
                added = 0
            fold[0].add(ev, nbytes, duration)
            fold[2] = max(fold[2], busy_end(ev))
        self.first_ts = ev.ts_ns if not self.count else min(self.first_ts, ev.ts_ns)
        self.count += n
        return added, n

    @property
    def entries(self) -> int:
        return len(self.calls) + len(self.folds)

    def outcome(self, rule: Rule, request: Optional[Request], links: list) -> Outcome:
        return Outcome(rule, request, links, self.calls, list(self.folds.values()), self.count, self.first_ts)
