"""Where each CUDA call of a traced process goes: a request's span, or one of its
process's windows (model.ATTRIBUTIONS), by the first rule of pipeline/rules.py that
applies to the call's facts (pipeline/rule_facts.py). A hold rule keeps the call in its
process's hold engine (pipeline/held.py) under a unit policy; the rules settle it later
(Outcome), and it is placed then. A call is never guessed onto a request.

Windows go out at each Tick (Stitcher.process), and a shared window also at each
synchronising call of its process (one batch step). Calls the kernel counted by itself
arrive as KernelRollup records (outside requests, or shared while related processes have
requests open), and, past a thread's per-request streaming budget, as CallAggregate
counts, a thread's in one AggregateRun placed where the calls were made (between the
same HTTP records): attributed by the same rules as the calls one by one.

CallAttribution is the CUDA half of pipeline/stitcher.Stitcher; it reads the processes
of the StitchState it shares with the HTTP half (pipeline/connections.py), which tells it
when requests open and finish."""
from __future__ import annotations

from typing import Optional

from ..records import AggregateRun, CallAggregate, CudaCall, DeviceCall, KernelRollup, SyncCall
from .held import Outcome, share
from .model import AMBIGUOUS, ATTRIBUTIONS, PROCESS, SHARED, TASK, THREAD, CallSink, ProcessWindow, RollupAgg
from .process_state import Proc, StitchState
from .rule_facts import CallFacts
from .rules import HELD, HELD_FULL, RULES, Rule, decide
from .steps import BatchSteps


class CallAttribution:
    def __init__(self, state: StitchState, steps: BatchSteps) -> None:
        self.s, self.steps = state, steps
        self.attributed = dict.fromkeys(ATTRIBUTIONS, 0)
        self.by_rule = dict.fromkeys((r.name for r in RULES), 0)  # calls by the rule that decided them
        # A KernelRollup's calls were made while none of its process's requests could be open.
        self._rollup_groups = lambda p: [] if p.open else self._group_requests(p)

    # --- records -----------------------------------------------------------------------
    def on_cuda(self, ev: CudaCall, out: list) -> None:
        # The hot path (every streamed call): lookups kept to the minimum.
        p = self.s.procs.get(ev.tgid) or self.s.proc(ev.tgid, out)
        if type(ev) is DeviceCall:
            p.device_by_tid[ev.tid] = ev.device
            return
        device = p.device_by_tid.get(ev.tid, 0)
        decided, target = self._decide(p, ev, ev.ts_ns, device, False)
        if decided is not None:
            self._count(decided, 1)
            attribution = decided.attribution
            if attribution is THREAD or attribution is TASK or attribution is PROCESS:
                target.sink.add(ev, attribution)
                target.busy.add(ev, device)
            else:
                window = self._window(p, attribution, ev.ts_ns, device)
                window.sink.add(ev, attribution)
                window.end_ns = max(window.end_ns, ev.ts_ns + ev.amounts()[2])
                self._spread(window, target)
        if p.shared is not None and type(ev) is SyncCall:  # the batch step ends
            self.steps.ended(p.shared, out)
            p.shared = None

    def on_run(self, run: AggregateRun, out: list) -> None:
        """Calls the kernel counted instead of streaming them, at the point they were made:
        one thread's counts by (call, detail) between two records of its process. Their
        facts are the same where the process has requests open and each count's last call
        came after the latest of them began (open_at(ts) is then every open request for
        each): one decision for the run, however many kernels it counts. Else each is
        decided at its own time."""
        aggs = run.aggregates
        p = self.s.procs.get(run.tgid) or self.s.proc(run.tgid, out)
        device = p.device_by_tid.get(run.tid, 0)
        if len(aggs) > 1 and p.open and min(a.last_ts for a in aggs) >= p.latest_start:
            facts, decided = self._rule(p, aggs[-1], aggs[-1].last_ts, True)
            if decided.attribution is HELD and p.holds.entries + len(aggs) < p.holds.max_held:
                p.policies[decided.holds].hold(facts, aggs, device, getattr(facts, decided.gives))
                return  # counted when they settle
            for a in aggs:
                self._place(p, a, *self._held(p, facts, decided, a, device), device)
            return
        for a in aggs:
            self._place(p, a, *self._decide(p, a, a.last_ts, device, True), device)

    def _place(self, p: Proc, a: CallAggregate, decided: Optional[Rule], target, device: int) -> None:
        if decided is None:
            return  # held: counted when it settles
        self._count(decided, a.count)
        attribution = decided.attribution
        agg = RollupAgg.counted(a)
        if attribution is THREAD or attribution is TASK or attribution is PROCESS:
            target.sink.add_rollup(agg, attribution, True)
            target.busy.extend(device, a.ts_ns, a.last_end_ts, a.call)
            return
        window = self._window(p, attribution, a.ts_ns, device)
        window.sink.add_rollup(agg, attribution, True)
        window.end_ns = max(window.end_ns, a.last_end_ts)
        self._spread(window, target, a.count)

    def on_kernel_rollup(self, k: KernelRollup, out: list) -> None:
        """Calls the BPF side counted while no request could be open (rollup map),
        made some time between `since_ns` (the previous read) and `now_ns`: shared
        (one window per Tick: no cut points) while related processes have requests open."""
        p = self.s.proc(k.tgid, out)
        facts = CallFacts(p, None, k.now_ns, [], None, None, self._rollup_groups)
        decided = decide(facts)
        attribution = decided.attribution
        self._count(decided, k.count)
        w = self._window(p, attribution, k.now_ns if k.since_ns is None else k.since_ns)
        w.sink.add_aggregate(k.call, k.detail, k.count, k.bytes, k.duration_ns, k.now_ns, attribution, k.kernels)
        w.end_ns = max(w.end_ns, k.now_ns)
        self._link(w, getattr(facts, decided.gives) if decided.gives else ())

    def _decide(self, p: Proc, ev, ts: int, device: int, aggregate: bool):
        """(rule, its request or links) for a call or CallAggregate made at `ts`, or
        (None, None) when a hold rule kept it (counted when it settles)."""
        facts, decided = self._rule(p, ev, ts, aggregate)
        return self._held(p, facts, decided, ev, device)

    def _rule(self, p: Proc, ev, ts: int, aggregate: bool) -> tuple[CallFacts, Rule]:
        unit, owner = (p.contexts.call(ev) or (None, None)) if ev.ctx else (None, None)
        facts = CallFacts(p, ev, ts, p.open_at(ts), unit, owner, self._group_requests, aggregate)
        return facts, decide(facts)

    @staticmethod
    def _held(p: Proc, facts: CallFacts, decided: Rule, ev, device: int):
        """`decided`'s (rule, request or links), or (None, None) once a hold rule kept `ev`."""
        target = getattr(facts, decided.gives) if decided.gives else None
        if decided.attribution is not HELD:
            return decided, target
        if p.holds.entries >= p.holds.max_held and p.holds.full():
            return HELD_FULL, target
        p.policies[decided.holds].hold(facts, (ev,), device, target)
        return None, None

    def _spread(self, window: ProcessWindow, target, count: int = 1) -> None:
        """An ambiguous window's calls count a share on each candidate; ambiguous and
        shared windows link them."""
        if window.attribution == AMBIGUOUS:
            share(target, count)
        if target:
            self._link(window, target)

    def _count(self, decided: Rule, n: int) -> None:
        self.attributed[decided.attribution] += n
        self.by_rule[decided.name] += n

    def _group_requests(self, p: Proc) -> list:
        """The open requests of the other processes in `p`'s group (pipeline/groups.py)."""
        serving, groups = self.s.serving, self.s.groups
        if not serving or list(serving) == [p.tgid]:
            return []
        key = groups.get(p.tgid)
        if key is None:
            return []
        return [r for q in serving.values() if q is not p and groups.get(q.tgid) == key for r in q.open]

    # --- requests (told by the HTTP half) -------------------------------------------
    def opened(self, p: Proc, req) -> None:
        p.holds.opened(req)
        p.contexts.opened(req)
        p.threads.opened(req)

    def finished(self, p: Proc, req) -> None:
        """`req` is done: the held calls it settles land, then its policies forget it."""
        outcomes = p.holds.finished(req)
        p.contexts.finished(req)
        p.threads.finished(req)
        p.handlers.finished(req)
        self.settle(p, outcomes)

    def drain(self, p: Proc) -> None:
        self.settle(p, p.holds.drain())

    def settle(self, p: Proc, outcomes: list[Outcome]) -> None:
        """Held calls whose owner is now known (earlier than now: they were held). The
        candidates of ambiguous ones counted them when they finished."""
        for o in outcomes:
            self._count(o.rule, o.count)
            if (r := o.request) is not None:
                for ev, device in o.calls:
                    r.sink.add(ev, o.attribution)
                    r.busy.add(ev, device)
                if o.folds:  # the hold's own folds, handed over
                    folds = o.folds
                    r.sink.add_rollups([f[0] for f in folds], o.attribution, True)
                    agg, device, _ = folds[0]  # the first sets the window's device, as one by one
                    r.busy.extend(device, min(f[0].first_ts for f in folds), max(f[2] for f in folds), agg.call)
                continue
            w = self._window(p, o.attribution, o.start_ns)
            for ev, _ in o.calls:
                w.sink.add(ev, o.attribution)
                w.end_ns = max(w.end_ns, ev.ts_ns + ev.amounts()[2])
            if o.folds:
                w.sink.add_rollups([f[0] for f in o.folds], o.attribution, True)
                w.end_ns = max(w.end_ns, max(f[0].last_end_ts for f in o.folds))
            self._link(w, o.links)

    # --- windows ---------------------------------------------------------------------
    def _window(self, p: Proc, attribution: str, ts: int, device: Optional[int] = None) -> ProcessWindow:
        w = getattr(p, attribution)
        if w is None:
            w = ProcessWindow(p.tgid, attribution, ts, ts, CallSink(self.s.span_budget), device=device)
            setattr(p, attribution, w)
        elif w.device is None:
            w.device = device
        w.start_ns = min(w.start_ns, ts)
        if p.untracked > w.untracked_connections:
            w.untracked_connections = p.untracked  # its calls may be requests we could not see
        return w

    @staticmethod
    def _link(window: ProcessWindow, requests: list) -> None:
        shared = window.attribution == SHARED  # a batch step: its members are read later (steps.py)
        for r in requests:
            ids = (r.trace_id, r.span_id)
            if ids not in window.candidate_ids:
                window.candidate_ids.add(ids)
                window.candidates.append(ids)
                window.links_sampled = window.links_sampled or r.sampled
                if shared:
                    window.linked[ids] = r

    def flush_windows(self, out: list) -> None:
        """Hands on the ambiguous/shared/outside windows collected so far (once per Tick)."""
        for p in self.s.procs.values():
            self.flush_process_windows(p, out)

    def flush_process_windows(self, p: Proc, out: list) -> None:
        for attr in ("ambiguous", "shared", "outside"):
            w = getattr(p, attr)
            if w is not None:
                if w.linked:  # shared, cut by the flush or an exit: no step to read membership by
                    self.steps.unstepped(w)
                out.append(w)
                setattr(p, attr, None)

