"""Where each CUDA call of a traced process goes: a request's span, or one of its
process's windows (model.ATTRIBUTIONS), by the first rule of pipeline/rules.py RULES
that applies: the unit rules (pipeline/contexts.py) for a call made in a tracked
execution unit, then the thread and process rules here (attribute()), with the handler
rules (pipeline/handlers.py) for the ambiguous calls of gRPC handler threads. A call is
never guessed onto a request.

Windows go out at each Tick (Stitcher.process), and a shared window also at each
synchronising call of its process (one batch step). Calls the kernel counted by itself
arrive as KernelRollup records (outside requests, or shared while related processes have
requests open), and, past a thread's per-request streaming budget, as CallAggregate
records placed where the calls were made (between the same HTTP records): attributed by
the same rules as the calls one by one.

CallAttribution is the CUDA half of pipeline/stitcher.Stitcher, which keeps the state it
reads: procs (Proc: open requests, windows, units, handler pairs), _serving (processes
with open requests), groups (ProcessGroup records), span_budget, attributed, by_rule and _proc()."""
from __future__ import annotations

from dataclasses import replace
from typing import Optional

from ..records import CallAggregate, CudaCall, DeviceCall, KernelRollup, SyncCall
from .handlers import HandlerPairs
from .held import Outcome
from .model import AMBIGUOUS, PROCESS, SHARED, TASK, THREAD, CallSink, ProcessWindow, RollupAgg
from .process_state import Proc
from .rules import HELD, Rule, rule, share

THREAD_UNFOLLOWED, THREAD_ONE, THREAD_SEVERAL = (rule(n) for n in ("thread.unfollowed", "thread.one",
                                                                   "thread.several"))
PROCESS_IDLE, PROCESS_ONE, PROCESS_SEVERAL, PROCESS_UNTRACKED, PROCESS_UNSEEN, PROCESS_UNFOLLOWED = (
    rule(n) for n in ("process.idle", "process.one", "process.several", "process.untracked", "process.unseen",
                      "process.unfollowed"))
UNIT_UNOWNED = rule("unit.unowned")
GROUP_BATCH, HANDLER_HELD_FULL, THREAD_HELD_FULL = (rule(n) for n in ("group.batch", "handler.held_full",
                                                                      "thread.held_full"))

class CallAttribution:
    def _on_cuda(self, ev: CudaCall, out: list) -> None:
        # The hot path (every streamed call): lookups kept to the minimum.
        p = self.procs.get(ev.tgid) or self._proc(ev.tgid, out)
        if type(ev) is DeviceCall:
            p.device_by_tid[ev.tid] = ev.device
            return
        self._on_call(p, ev, out)
        if p.shared is not None and type(ev) is SyncCall:  # the batch step ends
            self.steps.ended(p.shared, out)
            p.shared = None

    def _on_call(self, p: Proc, ev: CudaCall, out: list) -> None:
        device = p.device_by_tid.get(ev.tid, 0)
        verdict = self._verdict(p, ev, device)
        if verdict is HELD:
            return
        decided, target = verdict
        attribution = decided.attribution
        if attribution is AMBIGUOUS and ev.tid not in p.broken and not p.untracked \
                and HandlerPairs.applies(target) and self._handler_pair(p, ev, target):
            if p.pairs.hold((ev.tid, ev.ctx), target, ev, device):
                return  # counted when it settles
            decided = HANDLER_HELD_FULL
        self._count(decided, 1)
        if attribution is THREAD or attribution is TASK or attribution is PROCESS:
            target.sink.add(ev, attribution)
            target.busy.add(ev, device)
            return
        window = self._window(p, attribution, ev.ts_ns, device)
        window.sink.add(ev, attribution)
        window.end_ns = max(window.end_ns, ev.ts_ns + ev.amounts()[2])
        if attribution == AMBIGUOUS:
            share(target, 1)
        if attribution == AMBIGUOUS or attribution == SHARED:
            self._link(window, target)

    def _on_aggregate(self, a: CallAggregate, out: list) -> None:
        """Calls the kernel counted instead of streaming them, at the point they were made."""
        p = self.procs.get(a.tgid) or self._proc(a.tgid, out)
        device = p.device_by_tid.get(a.tid, 0)
        verdict = self._verdict(p, a, device)
        if verdict is HELD:
            return
        decided, target = verdict
        attribution = decided.attribution
        self._count(decided, a.count)
        agg = RollupAgg(a.call, a.detail, a.count, a.bytes, a.duration_ns, a.ts_ns, a.last_ts, a.last_end_ts,
                        a.kernels)
        if attribution is THREAD or attribution is TASK or attribution is PROCESS:
            target.sink.add_rollup(agg, attribution)
            target.busy.extend(device, a.ts_ns, a.last_end_ts)
            return
        window = self._window(p, attribution, a.ts_ns, device)
        window.sink.add_rollup(agg, attribution)
        window.end_ns = max(window.end_ns, a.last_end_ts)
        if attribution == AMBIGUOUS:
            share(target, a.count)
        if attribution == AMBIGUOUS or attribution == SHARED:
            self._link(window, target)

    def _on_kernel_rollup(self, k: KernelRollup, out: list) -> None:
        """Calls the BPF side counted while no request could be open (rollup map),
        made some time between `since_ns` (the previous read) and `now_ns`: shared
        (one window per Tick: no cut points) while related processes have requests open."""
        p = self._proc(k.tgid, out)
        group = [] if p.open else self._group_requests(p)
        decided = GROUP_BATCH if group else PROCESS_UNFOLLOWED if p.hidden else PROCESS_IDLE
        attribution = decided.attribution
        self._count(decided, k.count)
        w = self._window(p, attribution, k.now_ns if k.since_ns is None else k.since_ns)
        w.sink.add_aggregate(k.call, k.detail, k.count, k.bytes, k.duration_ns, k.now_ns, attribution, k.kernels)
        w.end_ns = max(w.end_ns, k.now_ns)
        self._link(w, group)

    def _verdict(self, p: Proc, ev, device: int):
        """HELD, or (rule, request or candidates) for a call or a CallAggregate."""
        ts = ev.last_ts if type(ev) is CallAggregate else ev.ts_ns
        open_requests = begun(p.open, ts)
        verdict = p.contexts.call(ev, device, open_requests) if ev.ctx else None
        if verdict is HELD:  # counted when it settles
            return HELD
        decided, target = verdict or attribute(open_requests, ev.tid, p.partial_heads, p.broken)
        if p.hidden and (decided.attribution is THREAD or decided.attribution is PROCESS
                         or decided is PROCESS_IDLE or decided is UNIT_UNOWNED):
            return PROCESS_UNFOLLOWED, list(open_requests)
        if (p.untracked or ev.http_unseen) and (decided.attribution is THREAD or decided.attribution is PROCESS):
            return (PROCESS_UNTRACKED if p.untracked else PROCESS_UNSEEN), list(open_requests)
        if decided is THREAD_ONE:  # counted once its thread is proven, or not (pipeline/threads.py)
            return (HELD if p.threads.hold(target, ev, device, open_requests)
                    else (THREAD_HELD_FULL, list(open_requests)))
        if decided is PROCESS_IDLE:
            group = begun(self._group_requests(p), ts)  # related processes' records: out of order too
            if group:
                return GROUP_BATCH, group
        return decided, target

    def _count(self, decided: Rule, n: int) -> None:
        self.attributed[decided.attribution] += n
        self.by_rule[decided.name] += n

    @staticmethod
    def _handler_pair(p: Proc, ev, requests) -> bool:
        """Made in a Python context the probes never saw created, on a thread that never
        ran a tracked one and read none of `requests` (pipeline/handlers.py)."""
        return bool(ev.ctx) and ev.ctx not in p.contexts.nodes and ev.tid not in p.contexts.threads \
            and all(r.tid != ev.tid for r in requests)

    def _group_requests(self, p: Proc) -> list:
        """The open requests of the other processes in `p`'s group (pipeline/groups.py)."""
        if not self._serving or list(self._serving) == [p.tgid]:
            return []
        key = self.groups.get(p.tgid)
        if key is None:
            return []
        return [r for q in self._serving.values() if q is not p and self.groups.get(q.tgid) == key
                for r in q.open]

    def _settle(self, p: Proc, outcomes: list[Outcome]) -> None:
        """Held calls whose owner is now known (earlier than now: they were held). The
        candidates of ambiguous ones counted them when they finished."""
        for o in outcomes:
            if o.rule is UNIT_UNOWNED and p.hidden:  # requests not seen may own them
                o = replace(o, rule=PROCESS_UNFOLLOWED)
            self._count(o.rule, o.count)
            if (r := o.request) is not None:
                for ev, device in o.calls:
                    r.sink.add(ev, o.attribution)
                    r.busy.add(ev, device)
                for agg, device, end in o.folds:
                    r.sink.add_rollup(agg, o.attribution)
                    r.busy.extend(device, agg.first_ts, end)
                continue
            w = self._window(p, o.attribution, o.start_ns)
            for ev, _ in o.calls:
                w.sink.add(ev, o.attribution)
                w.end_ns = max(w.end_ns, ev.ts_ns + ev.amounts()[2])
            for agg, _, _ in o.folds:
                w.sink.add_rollup(agg, o.attribution)
                w.end_ns = max(w.end_ns, agg.last_end_ts)
            self._link(w, o.links)

    def _window(self, p: Proc, attribution: str, ts: int, device: Optional[int] = None) -> ProcessWindow:
        w = getattr(p, attribution)
        if w is None:
            w = ProcessWindow(p.tgid, attribution, ts, ts, CallSink(self.span_budget), device=device)
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

    def _flush_windows(self, out: list) -> None:
        """Hands on the ambiguous/shared/outside windows collected so far (once per Tick)."""
        for p in self.procs.values():
            self._flush_process_windows(p, out)

    def _flush_process_windows(self, p: Proc, out: list) -> None:
        for attr in ("ambiguous", "shared", "outside"):
            w = getattr(p, attr)
            if w is not None:
                if w.linked:  # shared, cut by the flush or an exit: no step to read membership by
                    self.steps.unstepped(w)
                out.append(w)
                setattr(p, attr, None)


def begun(open_requests: list, ts: int) -> list:
    """The open requests that had begun by `ts`, a call's time: records of different CPUs
    come out of the ring buffer out of time order, so a request's head read on another
    CPU can come before a call made earlier (by microseconds; by milliseconds on a
    starved host). Such a request is no owner or candidate of that call."""
    for r in open_requests:
        if r.start_ns > ts:
            return [r for r in open_requests if r.start_ns <= ts]
    return open_requests


def attribute(open_requests: list, tid: int, partial_heads: dict = {}, broken: dict = {}):  # noqa: B006
    """(rule, request or candidate list or None) for a call on thread `tid` made in no
    tracked unit (partial_heads, broken: read only)."""
    if not open_requests:
        return PROCESS_IDLE, None
    on_thread = [r for r in open_requests if r.tid == tid]
    if tid in broken:  # it also serves a connection we cannot follow
        return THREAD_UNFOLLOWED, on_thread or list(open_requests)
    if len(on_thread) == 1:
        return THREAD_ONE, on_thread[0]
    if on_thread:
        return THREAD_SEVERAL, on_thread
    if len(open_requests) == 1 and tid not in partial_heads:
        return PROCESS_ONE, open_requests[0]
    return PROCESS_SEVERAL, list(open_requests)
