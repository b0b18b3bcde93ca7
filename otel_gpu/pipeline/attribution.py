"""Where each CUDA call of a traced process goes: a request's span, or one of its
process's windows (model.ATTRIBUTIONS). A call is attributed:
  - made in a Python context (ctx != 0) the probes saw created: to the request bound
    to that context or an ancestor, or held until one binds (pipeline/contexts.py) -> task
  - in an untracked context on an event-loop/worker thread: never by thread; below
  - by a handler thread of a multiplexed server (a gRPC pool thread in its own untracked
    context) where the rules below find several candidates: held, and given to the
    HTTP/2 stream whose frames that thread and context wrote alone, where that is
    provable (pipeline/handlers.py)                          -> task
  - to the one open request read by the calling thread       -> thread
  - else to the only open request of the process             -> process
  - else, with several candidates, to nobody: counted         -> ambiguous
  - with nothing open in the process while related processes
    (pipeline/groups.py: same cgroup, or parent/child) have
    requests open: to nobody, linked to all of those           -> shared
  - with nothing open, or made in a context no request owns   -> outside
A call is never guessed onto a request.

Windows go out at each Tick (Stitcher.process), and a shared window also at each
synchronising call of its process (one batch step). Calls the kernel counted by itself
arrive as KernelRollup records (outside requests, or shared while related processes have
requests open), and, past a thread's per-request streaming budget, as CallAggregate
records placed where the calls were made (between the same HTTP records): attributed by
the rules above exactly as the calls one by one.

CallAttribution is the CUDA half of pipeline/stitcher.Stitcher, which keeps the state it
reads: procs (Proc: open requests, windows, contexts, handler pairs), _serving (processes
with open requests), _group_of, span_budget, attributed, and _proc()."""
from __future__ import annotations

from typing import TYPE_CHECKING, Optional

from .contexts import HELD, Outcome
from .handlers import HandlerPairs
from .model import AMBIGUOUS, OUTSIDE, PROCESS, SHARED, TASK, THREAD, CallSink, ProcessWindow, RollupAgg
from .records import CallAggregate, CudaCall, DeviceCall, KernelRollup, SyncCall

if TYPE_CHECKING:
    from .stitcher import Proc


class CallAttribution:
    def _on_cuda(self, ev: CudaCall, out: list) -> None:
        # The hot path (every streamed call): lookups kept to the minimum.
        p = self.procs.get(ev.tgid) or self._proc(ev.tgid, out)
        if type(ev) is DeviceCall:
            p.device_by_tid[ev.tid] = ev.device
            return
        self._on_call(p, ev, out)
        if p.shared is not None and type(ev) is SyncCall:  # the batch step ends
            out.append(p.shared)
            p.shared = None

    def _on_call(self, p: Proc, ev: CudaCall, out: list) -> None:
        device = p.device_by_tid.get(ev.tid, 0)
        verdict = self._verdict(p, ev, device)
        if verdict is HELD:
            return
        attribution, target = verdict
        if attribution is AMBIGUOUS and ev.tid not in p.broken and not p.untracked \
                and HandlerPairs.applies(target) and self._handler_pair(p, ev, target) \
                and p.pairs.hold((ev.tid, ev.ctx), target, ev, device):
            return  # counted when it settles
        self.attributed[attribution] += 1
        if attribution is THREAD or attribution is TASK or attribution is PROCESS:
            target.sink.add(ev, attribution)
            target.busy.add(ev, device)
            return
        window = self._window(p, attribution, ev.ts_ns, device)
        window.sink.add(ev, attribution)
        window.end_ns = max(window.end_ns, ev.ts_ns + ev.amounts()[2])
        if attribution == AMBIGUOUS:
            for r in target:  # a share each: summed over spans, never more than the calls
                r.sink.summary.ambiguous += 1 / len(target)
            self._link(window, target)
        elif attribution == SHARED:
            self._link(window, target)

    def _on_aggregate(self, a: CallAggregate, out: list) -> None:
        """Calls the kernel counted instead of streaming them, at the point they were made."""
        p = self.procs.get(a.tgid) or self._proc(a.tgid, out)
        device = p.device_by_tid.get(a.tid, 0)
        verdict = self._verdict(p, a, device)
        if verdict is HELD:
            return
        attribution, target = verdict
        self.attributed[attribution] += a.count
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
            for r in target:
                r.sink.summary.ambiguous += a.count / len(target)
        if attribution == AMBIGUOUS or attribution == SHARED:
            self._link(window, target)

    def _on_kernel_rollup(self, k: KernelRollup, out: list) -> None:
        """Calls the BPF side counted while no request could be open (rollup map),
        made some time between `since_ns` (the previous read) and `now_ns`: shared
        (one window per Tick: no cut points) while related processes have requests open."""
        p = self._proc(k.tgid, out)
        group = [] if p.open else self._group_requests(p)
        attribution = SHARED if group else OUTSIDE
        self.attributed[attribution] += k.count
        w = self._window(p, attribution, k.now_ns if k.since_ns is None else k.since_ns)
        w.sink.add_aggregate(k.call, k.detail, k.count, k.bytes, k.duration_ns, k.now_ns, attribution, k.kernels)
        w.end_ns = max(w.end_ns, k.now_ns)
        self._link(w, group)

    def _verdict(self, p: Proc, ev, device: int):
        """HELD, or (attribution, request or candidates) for a call or a CallAggregate."""
        verdict = p.contexts.call(ev, device) if ev.ctx else None
        if verdict is HELD:  # counted when it settles
            return HELD
        attribution, target = verdict or attribute(p.open, ev.tid, p.partial_heads, p.broken)
        if p.untracked and (attribution is THREAD or attribution is PROCESS):
            attribution, target = AMBIGUOUS, list(p.open)  # a request we cannot see may own it
        if attribution == OUTSIDE and not p.open:
            target = self._group_requests(p)
            if target:
                attribution = SHARED
        return attribution, target

    @staticmethod
    def _handler_pair(p: Proc, ev, requests) -> bool:
        """Made in a Python context the probes never saw created, on a thread that never
        ran a tracked one and read none of `requests` (pipeline/handlers.py)."""
        return bool(ev.ctx) and ev.ctx not in p.contexts.nodes and ev.tid not in p.contexts.threads \
            and all(r.tid != ev.tid for r in requests)

    def _group_requests(self, p: Proc) -> list:
        """The open requests of the other processes in `p`'s group (pipeline/groups.py)."""
        if self._group_of is None or not self._serving or list(self._serving) == [p.tgid]:
            return []
        key = self._group_of(p.tgid)
        if key is None:
            return []
        return [r for q in self._serving.values() if q is not p and self._group_of(q.tgid) == key
                for r in q.open]

    def _settle(self, p: Proc, outcomes: list[Outcome]) -> None:
        """Held calls whose owner is now known (earlier than now: they were held). The
        candidates of ambiguous ones counted them when they finished."""
        for o in outcomes:
            self.attributed[o.attribution] += o.count
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
        for r in requests:
            ids = (r.trace_id, r.span_id)
            if ids not in window.candidates:
                window.candidates.append(ids)

    def _flush_windows(self, out: list) -> None:
        """Hands on the ambiguous/shared/outside windows collected so far (once per Tick)."""
        for p in self.procs.values():
            for attr in ("ambiguous", "shared", "outside"):
                w = getattr(p, attr)
                if w is not None:
                    out.append(w)
                    setattr(p, attr, None)


def attribute(open_requests: list, tid: int, partial_heads: dict = {}, broken: dict = {}):  # noqa: B006
    """(attribution, request or candidate list or None) for a call on thread `tid`
    (partial_heads, broken: read only)."""
    if not open_requests:
        return OUTSIDE, None
    on_thread = [r for r in open_requests if r.tid == tid]
    if tid in broken:  # it also serves a connection we cannot follow
        return AMBIGUOUS, on_thread or list(open_requests)
    if len(on_thread) == 1:
        return THREAD, on_thread[0]
    if on_thread:
        return AMBIGUOUS, on_thread
    if len(open_requests) == 1 and tid not in partial_heads:
        return PROCESS, open_requests[0]
    return AMBIGUOUS, list(open_requests)
