"""Calls held until their owner is known (a hold rule of pipeline/rules.py): one engine
per process, with one cap (MAX_HELD), one candidate index and one share, for every unit
policy (pipeline/contexts.py: execution units waiting for a binding; pipeline/threads.py:
threads waiting for proof that they served one request alone; pipeline/handlers.py:
handler threads waiting for their stream).

A hold keeps calls in a Group: one policy's key (a unit, a request, a handler pair) and
the requests that could own them (`cands`). The group is indexed under the candidates
its policy watches; each watched candidate ends its part one way:
  - it binds a unit (Holds.bound): the group is its, or it can no longer be (lost);
  - it finishes (Holds.finished), and the policy says (policy.on_finish):
    OWNS: the group is its; GIVE_UP: nobody can be proven its owner any more;
    PASS: not proven its, the others may still be.
A group settles when it has an owner, when its policy gives up, or when no watched
candidate is left; pipeline/rules.py settled() names the rule. Calls are kept one by one
up to the span budget per key (what a span can show) and folded by (call, detail) past
it, so counts always add up.

The share: a candidate counts 1/N of a group's calls (N: its candidates) when it finishes
while the group may still be ambiguous to it, or when the group settles ambiguous while
it is still open; never twice, and never one that bound another unit. So the shares
summed over spans never exceed the calls."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Callable, Optional

from ..ratelimit import RateLimitedLog, Stats
from ..records import CallAggregate
from .model import Request, RollupAgg, busy_end
from .rule_facts import SettleFacts
from .rules import MAX_HELD, Rule, settled

OWNS, GIVE_UP, PASS = "owns", "give_up", "pass"  # a policy's word on a watched candidate that finished


def share(requests, count: float, among: int = 0) -> None:
    """`count` ambiguous calls may be any of their `among` candidates' (default: the
    requests given): each of `requests` counts its 1/N."""
    n = among or len(requests)
    for r in requests:
        r.sink.summary.ambiguous += count / n


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


class Group:
    """Calls one policy holds under one key while one set of requests (`cands`) could own
    them."""
    __slots__ = ("policy", "key", "cands", "watched", "waiting", "lost", "passed", "settled", "calls", "folds",
                 "count", "first_ts")

    def __init__(self, policy, key, cands: tuple, watched: tuple) -> None:
        self.policy, self.key, self.cands, self.watched = policy, key, cands, watched
        self.waiting = len(watched)  # watched candidates that have not ended their part
        self.lost: set = set()   # id(candidate) that bound another unit
        self.passed: set = set()  # id(candidate) that finished and counted its share
        self.settled = False
        self.calls: list = []  # (call, device)
        self.folds: dict = {}  # (call, detail[, id]) -> [RollupAgg, device, busy end]
        self.count = 0
        self.first_ts = 0

    def add_counts(self, aggregates, device: int) -> int:
        """Holds CallAggregates (calls the kernel counted), a fold each; returns their calls."""
        folds, first, n = self.folds, None, 0
        for a in aggregates:
            agg = RollupAgg.counted(a)
            folds[(a.call, a.detail, id(agg))] = [agg, device, a.last_end_ts]
            n += a.count
            if first is None or a.ts_ns < first:
                first = a.ts_ns
        self.first_ts = first if not self.count else min(self.first_ts, first)
        self.count += n
        return n

    def add(self, ev, device: int, one_by_one: bool) -> tuple[int, int]:
        """Holds a call; returns the entries it added (0 when folded into an existing one)
        and the calls (1)."""
        n, added = 1, 1
        if one_by_one:
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


class Holds:
    """One process's held calls (module docstring). `proc`: its Proc (what settle rules read)."""

    def __init__(self, proc, keep: int, stats: Stats, ratelog: RateLimitedLog, max_held: int = MAX_HELD) -> None:
        self.proc, self.keep, self.stats, self._log, self.max_held = proc, keep, stats, ratelog, max_held
        self.index: dict[int, dict] = {}   # id(request) -> {Group watching it: None}
        self.last: dict[tuple, Group] = {}  # (policy name, key) -> its newest unsettled group
        self.pending: dict[tuple, int] = {}  # (policy name, key) -> its unsettled groups
        self.kept: dict[tuple, int] = {}    # (policy name, key) -> calls held one by one
        self.by_policy: dict[str, int] = {}  # policy name -> its unsettled groups
        self.open: set[int] = set()         # id(open request)
        self._open_cands: Optional[tuple] = None  # proc.open as a tuple, while no request opens or finishes
        self.entries = 0  # held calls and folds
        self.held = 0     # calls held (folded ones counted one by one)

    def opened(self, req: Request) -> None:
        self.open.add(id(req))
        self._open_cands = None

    def cands(self, requests: list) -> tuple:
        """`requests` as a hold's candidates: the same tuple for the process's open
        requests while none opens or finishes (a group goes on while they are the same)."""
        if requests is not self.proc.open:
            return tuple(requests)
        if self._open_cands is None:
            self._open_cands = tuple(requests)
        return self._open_cands

    def full(self) -> bool:
        """Past the cap (logged and counted): a hold rule's call is process.held_full."""
        if self.entries < self.max_held:
            return False
        self._log.event("held_calls_overflow", logging.WARNING,
                        "pid %d: %d CUDA calls wait for their owner; more are attributed ambiguous at once",
                        self.proc.tgid, self.held)
        return True

    def hold(self, policy, key, cands: tuple, watch, calls, device: int) -> None:
        """Holds calls for `policy` under `key` (a streamed call, or a thread's counts of
        one AggregateRun), owned by one of `cands` once proven; `watch`: the candidates
        whose binding or finish may settle them."""
        k = (policy.name, key)
        g = self.last.get(k)
        if g is None or (g.cands is not cands and not _same(g.cands, cands)):
            g = self.last[k] = Group(policy, key, cands, tuple(watch))
            self.pending[k] = self.pending.get(k, 0) + 1
            self.by_policy[policy.name] = self.by_policy.get(policy.name, 0) + 1
            for c in g.watched:
                self.index.setdefault(id(c), {})[g] = None
        if calls and calls[0].__class__ is CallAggregate:  # a thread's counts (an AggregateRun's)
            self.held += g.add_counts(calls, device)
            self.entries += len(calls)
            return
        for ev in calls:
            kept = self.kept.get(k, 0)
            one = kept < self.keep
            if one:
                self.kept[k] = kept + 1
            entries, n = g.add(ev, device, one)
            self.entries += entries
            self.held += n

    def holding(self, policy_name: str, key) -> bool:
        return (policy_name, key) in self.pending

    def count(self, policy_name: str) -> int:
        """How many groups of one policy are unsettled."""
        return self.by_policy.get(policy_name, 0)

    def groups(self, policy_name: str) -> set:
        """The unsettled groups of one policy (rarely: a policy trimming its memory)."""
        return {g for gs in self.index.values() for g in gs if g.policy.name == policy_name}

    # --- a watched candidate ends its part -----------------------------------------
    def bound(self, req: Request, owns: Callable[[Group], bool]) -> list[Outcome]:
        """`req` bound a unit: each group watching it is its (`owns`), or can no longer be."""
        out: list[Outcome] = []
        for g in self.index.pop(id(req), ()):
            if owns(g):
                out.append(self._settle(g, req))
            else:
                g.lost.add(id(req))
                out += self._step(g)
        return out

    def finished(self, req: Request) -> list[Outcome]:
        """`req` is done: each group watching it settles or waits, as its policy says."""
        self.open.discard(id(req))
        self._open_cands = None
        out: list[Outcome] = []
        for g in self.index.pop(id(req), ()):
            word = g.policy.on_finish(g, req)
            if word is OWNS:
                out.append(self._settle(g, req))
                continue
            share((req,), g.count, len(g.cands))
            g.passed.add(id(req))
            out += [self._settle(g, None)] if word is GIVE_UP else self._step(g)
        return out

    def drain(self) -> list[Outcome]:
        """Every held call settles now (collector stopping, process gone)."""
        return [self._settle(g, None) for g in list(dict.fromkeys(g for gs in self.index.values() for g in gs))]

    def _step(self, g: Group) -> list[Outcome]:
        g.waiting -= 1
        return [self._settle(g, None)] if g.waiting <= 0 else []

    def _settle(self, g: Group, owner: Optional[Request]) -> Outcome:
        g.settled = True
        for c in g.watched:
            gs = self.index.get(id(c))
            if gs is not None and gs.pop(g, 0) is None and not gs:
                del self.index[id(c)]
        links: list = []
        if owner is None:
            share([c for c in g.cands if id(c) in self.open and id(c) not in g.lost and id(c) not in g.passed],
                  g.count, len(g.cands))
            links = [c for c in g.cands if id(c) not in g.lost]
        k = (g.policy.name, g.key)
        if self.last.get(k) is g:
            del self.last[k]
        self.pending[k] -= 1
        self.by_policy[g.policy.name] -= 1
        if not self.pending[k]:
            del self.pending[k]
        kept = self.kept.get(k, 0) - len(g.calls)
        if kept > 0:
            self.kept[k] = kept
        else:
            self.kept.pop(k, None)
        self.entries -= g.entries
        self.held -= g.count
        rule = settled(SettleFacts(g.policy.name, owner, links, self.proc))
        return Outcome(rule, owner, links, g.calls, list(g.folds.values()), g.count, g.first_ts)


def _same(a: tuple, b: tuple) -> bool:
    return a is b or (len(a) == len(b) and all(x is y for x, y in zip(a, b)))
