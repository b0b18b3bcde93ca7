"""Stage (before the stitcher): what each CUDA graph launch runs.

Kernels launched on a stream between its capture begin and end (cudaStreamBeginCapture /
cuStreamBeginCapture ... EndCapture) are recorded into a graph and do not run. The BPF
side streams every launch of a process that has a capture open, flagged `capture`
(bpf/graph_capture.c); here a flagged launch on a capturing stream is taken out of the
batch (never counted as a launch, in spans, summaries, cost or metrics) and remembered
as one of the graph's kernels; one on another stream ran and goes on. Instantiate maps
graph -> exec, and each graph launch (GraphCall, or a rollup/aggregate of them, whose
detail is the exec) gets the exec's kernels as ((func, count), ...): the sink counts them
as graph kernels and export names them.

State is per process and bounded: graphs and execs are forgotten when destroyed (after
the next two flushes, so rollups of their last launches still find them) or when the
process exits; past MAX_PER_PROCESS the least recently used goes, counted
(`graphs_evicted`). Not covered: graphs built node by node (cudaGraphAddKernelNode),
conditional nodes, cudaGraphExecUpdate (the exec keeps its instantiated kernels)."""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Optional

from ..cuda_calls import BY_NAME, Category, ids_in
from ..records import AggregateRun, GraphCall, GraphOp, KernelRollup, LaunchCall, ProcExit, Tick

log = logging.getLogger(__name__)

MAX_PER_PROCESS = 1024  # graphs, and execs, each (LRU past it)
MAX_CAPTURES = 64       # streams capturing at once in one process
_BEGIN = frozenset(BY_NAME[n].id for n in ("cudaStreamBeginCapture", "cuStreamBeginCapture"))
_END = frozenset(BY_NAME[n].id for n in ("cudaStreamEndCapture", "cuStreamEndCapture"))
_INSTANTIATE = frozenset(BY_NAME[n].id for n in ("cudaGraphInstantiate", "cuGraphInstantiate"))
_GRAPH_DESTROY = frozenset(BY_NAME[n].id for n in ("cudaGraphDestroy", "cuGraphDestroy"))
_EXEC_DESTROY = frozenset(BY_NAME[n].id for n in ("cudaGraphExecDestroy", "cuGraphExecDestroy"))
_GRAPH_LAUNCHES = ids_in(Category.GRAPH)


class _Lru(OrderedDict):
    def put(self, key, value) -> bool:
        """True when the least recently used entry had to go."""
        self[key] = value
        self.move_to_end(key)
        if len(self) > MAX_PER_PROCESS:
            self.popitem(last=False)
            return True
        return False

    def use(self, key):
        value = self.get(key)
        if value is not None:
            self.move_to_end(key)
        return value


class _Proc:
    __slots__ = ("captures", "graphs", "execs", "dying")

    def __init__(self) -> None:
        self.captures: dict[int, dict] = {}  # stream -> {func: count}, in first-launch order
        self.graphs = _Lru()                 # graph -> ((func, count), ...)
        self.execs = _Lru()                  # exec -> ((func, count), ...)
        self.dying: list = []                # (ticks left, table, key) of destroyed ones


class Graphs:
    def __init__(self) -> None:
        self.procs: dict[int, _Proc] = {}
        self.captured = 0          # launches recorded into graphs (not run)
        self.graph_launches_named = 0
        self.graph_launches_unknown = 0  # exec whose capture was not seen
        self.evicted = 0
        self.captures_dropped = 0  # capture ended with an error, or past MAX_CAPTURES
        self.held: list = []       # rollups of graph launches of an exec not known yet (one batch)

    def process(self, records: list) -> list:
        held, self.held = self.held, []
        out = self._process(records)
        if held:  # after this batch's graph ops: they may name them now
            for r in held:
                self._name_launch(r, hold=False)
            out = held + out
        return out

    def _process(self, records: list) -> list:
        out = None  # built only once a record is taken out
        for i, r in enumerate(records):
            t = type(r)
            if t is LaunchCall:
                if r.capture and self._recorded(r):
                    if out is None:
                        out = records[:i]
                    continue
            elif t is GraphOp:
                self._on_op(r)
                if out is None:
                    out = records[:i]
                continue
            elif t is GraphCall or (t is KernelRollup and r.call in _GRAPH_LAUNCHES):
                if self._name_launch(r, hold=t is KernelRollup):
                    if out is None:
                        out = records[:i]
                    continue
            elif t is AggregateRun:
                for a in r.aggregates:
                    if a.call in _GRAPH_LAUNCHES:
                        self._name_launch(a, hold=False)
            elif t is ProcExit:
                self.procs.pop(r.tgid, None)
            elif t is Tick:
                self._tick()
                if r.final and self.held:  # nothing comes after: the held ones go now
                    if out is None:
                        out = records[:i]
                    for h in self.held:
                        self._name_launch(h, hold=False)
                    out += self.held
                    self.held = []
            if out is not None:
                out.append(r)
        return records if out is None else out

    def _recorded(self, r: LaunchCall) -> bool:
        p = self.procs.get(r.tgid)
        capture = p.captures.get(r.stream) if p else None
        if capture is None:
            return False  # another stream: it ran
        capture[r.func] = capture.get(r.func, 0) + 1
        self.captured += 1
        return True

    def _proc(self, tgid: int) -> _Proc:
        p = self.procs.get(tgid)
        if p is None:
            p = self.procs[tgid] = _Proc()
        return p

    def _on_op(self, op: GraphOp) -> None:
        p = self._proc(op.tgid)
        if op.call in _BEGIN:
            if op.ret != 0:
                return
            if op.stream in p.captures:
                return  # the runtime's begin passing through the driver: one capture
            if len(p.captures) >= MAX_CAPTURES:
                self.captures_dropped += 1
                log.warning("process %d: more than %d streams capturing at once; capture on %#x not followed",
                            op.tgid, MAX_CAPTURES, op.stream)
                return
            p.captures[op.stream] = {}
        elif op.call in _END:
            capture = p.captures.pop(op.stream, None)
            if capture is None:
                return  # begin not seen, or the driver's end of the same capture already took it
            if op.ret != 0 or op.unreadable or not op.graph:
                self.captures_dropped += 1
                log.info("process %d: capture on %#x ended with %d: its %d launches are not a graph",
                         op.tgid, op.stream, op.ret, sum(capture.values()))
                return
            self.evicted += p.graphs.put(op.graph, tuple(capture.items()))
        elif op.call in _INSTANTIATE:
            kernels = p.graphs.use(op.graph)
            if op.ret == 0 and not op.unreadable and op.graph_exec and kernels is not None:
                self.evicted += p.execs.put(op.graph_exec, kernels)
        elif op.call in _GRAPH_DESTROY:
            self._dying(p, p.graphs, op.graph)
        elif op.call in _EXEC_DESTROY:
            self._dying(p, p.execs, op.graph_exec)

    @staticmethod
    def _dying(p: _Proc, table: _Lru, key: int) -> None:
        if key in table:
            p.dying.append([2, table, key, table[key]])

    def _name_launch(self, r, hold: bool) -> bool:
        """Names a graph launch (or a count of them); True: held for the next batch. The
        kernel's counts are read right after a ring-buffer poll, so the graph ops of a
        replay counted there may still be in the ring buffer: a rollup of an exec not
        known yet waits for the next batch (after its ops), once."""
        p = self.procs.get(r.tgid)
        exec_ = r.graph_exec if type(r) is GraphCall else r.detail
        kernels: Optional[tuple] = p.execs.use(exec_) if p else None
        if kernels is None:
            if hold:
                self.held.append(r)
                return True
            self.graph_launches_unknown += 1
            return False
        r.kernels = kernels
        self.graph_launches_named += 1
        return False

    def _tick(self) -> None:
        for p in self.procs.values():
            if not p.dying:
                continue
            keep = []
            for d in p.dying:
                d[0] -= 1
                if d[0] > 0:
                    keep.append(d)
                elif d[1].get(d[2]) is d[3]:  # not a new graph at a reused address
                    del d[1][d[2]]
            p.dying = keep

    def state(self) -> dict:
        return {"graph_launches_captured": self.captured, "graph_launches_named": self.graph_launches_named,
                "graph_launches_unknown": self.graph_launches_unknown, "graphs_evicted": self.evicted,
                "graph_captures_dropped": self.captures_dropped}
