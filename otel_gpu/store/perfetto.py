"""`otel-gpu traces --format perfetto`: stored traces as Chrome trace-event JSON (the JSON
Object Format: {"traceEvents": [...]}) for ui.perfetto.dev, chrome://tracing's successors
and speedscope.

Tracks are threads (pid, tid). A request is a complete event ("X") on the thread that read
it; its CUDA calls made on that thread are X events inside its time, so viewers nest them
under it. A call attributed to the request but made on another thread (attribution
`process`, or `task` on a worker thread) is on its own thread's track, linked back by a
flow arrow (ph "s" in the request, "f" on the call) and by the request's trace id in its
args. Events on one track must nest or not overlap: requests that overlap on one thread
(an asyncio loop serves many at once) go on extra lanes of that thread, tracks with a
synthetic tid above Linux's pid_max, named "thread T, lane N". GPU work no single request
owns (ambiguous, shared and outside windows) is on one track per process and kind, each
window a slice with its calls inside (their thread in args).

ts/dur are microseconds since the earliest span exported (a double holds ns exactly only
that close to zero); otherData.epoch_ns_at_zero says when that was."""
from __future__ import annotations

import json
from typing import Optional

from opentelemetry.trace import SpanKind

from .. import semconv as sc
from ..span_tree import graph_kernels_text

PID_MAX = 1 << 22  # Linux's largest pid_max: synthetic tids start above it
_ARGS = (sc.GPU_ATTRIBUTION, sc.THREAD_ID, sc.GPU_CUDA_CALL, sc.GPU_HIP_CALL, sc.GPU_KERNEL_NAME, sc.GPU_GRID, sc.GPU_BLOCK,
         sc.GPU_SHARED_MEMORY_BYTES, sc.GPU_STREAM, sc.GPU_MEMCPY_BYTES, sc.GPU_MEMCPY_DIRECTION, sc.GPU_ALLOC_BYTES,
         sc.GPU_ROLLUP_COUNT, sc.GPU_ROLLUP_BYTES, sc.GPU_CUDA_RETURN_CODE, sc.GPU_HIP_RETURN_CODE, sc.HTTP_REQUEST_METHOD, sc.HTTP_ROUTE,
         sc.HTTP_RESPONSE_STATUS_CODE, sc.GPU_LAUNCHES, sc.GPU_MEMCPY_H2D_BYTES, sc.GPU_MEMCPY_D2H_BYTES,
         sc.GPU_SYNC_DURATION_NS, sc.GPU_COST_SECONDS, sc.GPU_COST_AMOUNT, sc.GPU_COST_CURRENCY, sc.GPU_FEATURE,
         sc.GPU_CANDIDATE_REQUESTS, sc.GPU_NCCL_OP, sc.GPU_NCCL_COUNT, sc.GPU_NCCL_BYTES, sc.GPU_NCCL_DATATYPE,
         sc.GPU_NCCL_REDUCTION, sc.GPU_NCCL_ROOT, sc.GPU_NCCL_PEER, sc.GPU_NCCL_COMM, sc.GPU_NCCL_COMM_NRANKS,
         sc.GPU_NCCL_COMM_RANK, sc.GPU_NCCL_GROUP, sc.GPU_NCCL_CALLS, sc.GPU_NCCL_TOTAL_BYTES, sc.GPU_GRAPH_KERNELS,
         sc.GPU_GRAPH_KERNEL_COUNTS, sc.GPU_GRAPH_KERNEL_NODES, sc.GPU_GRAPH_KERNEL_LAUNCHES)
WINDOW_TRACKS = {"ambiguous": "GPU work, ambiguous request", "shared": "GPU work, shared by requests",
                 "outside": "GPU work outside requests"}


def call_label(attrs: dict, name: str) -> str:
    """A call's slice name: the call and what it did (kernel, bytes, a graph's kernels),
    short enough to read."""
    kernel = attrs.get(sc.GPU_KERNEL_NAME)
    if kernel:
        return f"{name} {kernel.split('(', 1)[0]}"
    if sc.GPU_NCCL_BYTES in attrs:
        return f"{name} {attrs[sc.GPU_NCCL_BYTES]} B"
    graph = graph_kernels_text(attrs)
    if graph:
        return f"{name} [{graph}]"
    if sc.GPU_MEMCPY_BYTES in attrs:
        return f"{name} {attrs.get(sc.GPU_MEMCPY_DIRECTION, '')} {attrs[sc.GPU_MEMCPY_BYTES]} B".replace("  ", " ")
    return name


def _args(span, trace_id: str) -> dict:
    a = span.attributes or {}
    args = {k: (list(a[k]) if isinstance(a[k], tuple) else a[k]) for k in _ARGS if k in a}
    args["trace_id"] = trace_id
    args["span_id"] = f"{span.context.span_id:016x}"
    return args


class _Item:
    """A top-level slice of a track (request, window or lone call) with the calls nested in it."""
    __slots__ = ("span", "trace_id", "kind", "children", "flow_from")

    def __init__(self, span, trace_id: str, kind: str, flow_from=None) -> None:
        self.span, self.trace_id, self.kind, self.children, self.flow_from = span, trace_id, kind, [], flow_from


def _inside(child, parent) -> bool:
    return parent.start_time <= child.start_time and child.end_time <= parent.end_time


def _pid(span) -> int:
    res = span.resource.attributes if span.resource is not None else {}
    return int(res.get(sc.PROCESS_PID) or (span.attributes or {}).get(sc.PROCESS_PID) or 0)


def _items(trace: list) -> list[tuple[tuple, _Item]]:
    """(track group, item) pairs of one stored trace: its root, and its children nested in
    it or on their own thread."""
    ids = {s.context.span_id for s in trace}
    roots = [s for s in trace if s.parent is None or s.parent.span_id not in ids]
    out = []
    for root in roots:
        trace_id = f"{root.context.trace_id:032x}"
        pid = _pid(root)
        attrs = root.attributes or {}
        if root.kind == SpanKind.SERVER:
            group = (pid, "thread", attrs.get(sc.THREAD_ID, pid))
            item = _Item(root, trace_id, "request")
        else:
            group = (pid, "window", attrs.get(sc.GPU_ATTRIBUTION, "outside"))
            item = _Item(root, trace_id, "window")
        out.append((group, item))
        for child in sorted((s for s in trace if s.parent is not None and s.parent.span_id == root.context.span_id),
                            key=lambda s: s.start_time):
            tid = (child.attributes or {}).get(sc.THREAD_ID, group[2] if item.kind == "request" else None)
            same_track = item.kind == "window" or tid == group[2]
            if same_track and _inside(child, root):
                item.children.append(child)
            else:  # another thread, or (never expected) outside the request's time: own slice, linked
                other = (pid, "thread", tid if tid is not None else group[2])
                out.append((other, _Item(child, trace_id, "call", flow_from=item)))
    return out


def _lanes(items: list[_Item]) -> list[list[_Item]]:
    """Greedy interval packing: each lane holds slices that do not overlap."""
    lanes: list[list[_Item]] = []
    for item in sorted(items, key=lambda i: (i.span.start_time, -i.span.end_time)):
        for lane in lanes:
            if lane[-1].span.end_time <= item.span.start_time:
                lane.append(item)
                break
        else:
            lanes.append([item])
    return lanes


def trace_events(request_traces: list[list], window_traces: list[list] = ()) -> dict:
    """The JSON object (a dict) for the traces given as lists of stored spans (traces.trace_spans)."""
    groups: dict = {}
    for trace in list(request_traces) + list(window_traces):
        for group, item in _items(trace):
            groups.setdefault(group, []).append(item)
    spans = [i.span for items in groups.values() for i in items]
    zero = min((s.start_time for s in spans), default=0)

    def us(ns: int) -> float:
        return (ns - zero) / 1000

    events: list[dict] = []
    services: dict = {}
    track_of: dict = {}  # id(item) -> (pid, tid): where flows start
    next_tid = PID_MAX + 1
    # Real threads first, in tid order; then each process's window tracks.
    for group in sorted(groups, key=lambda g: (g[0], g[1] != "thread", g[2] if isinstance(g[2], int) else 0, str(g[2]))):
        pid, what, key = group
        for n, lane in enumerate(_lanes(groups[group])):
            if what == "thread" and n == 0 and isinstance(key, int):
                tid, name = key, f"thread {key}" + (" (main)" if key == pid else "")
            else:
                tid, next_tid = next_tid, next_tid + 1
                name = (f"thread {key}, lane {n + 1}" if what == "thread"
                        else WINDOW_TRACKS.get(key, f"GPU work ({key})") + (f", lane {n + 1}" if n else ""))
            events.append({"ph": "M", "name": "thread_name", "pid": pid, "tid": tid, "args": {"name": name}})
            events.append({"ph": "M", "name": "thread_sort_index", "pid": pid, "tid": tid,
                           "args": {"sort_index": tid}})
            for item in lane:
                track_of[id(item)] = (pid, tid)
                s = item.span
                res = s.resource.attributes if s.resource is not None else {}
                services.setdefault(pid, res.get(sc.SERVICE_NAME) or "unknown_service")
                name = s.name if item.kind != "call" else call_label(s.attributes or {}, s.name)
                events.append({"ph": "X", "cat": item.kind if item.kind != "call" else "cuda", "name": name,
                               "ts": us(s.start_time), "dur": (s.end_time - s.start_time) / 1000,
                               "pid": pid, "tid": tid, "args": _args(s, item.trace_id)})
                for c in item.children:
                    events.append({"ph": "X", "cat": "cuda", "name": call_label(c.attributes or {}, c.name),
                                   "ts": us(c.start_time), "dur": (c.end_time - c.start_time) / 1000,
                                   "pid": pid, "tid": tid, "args": _args(c, item.trace_id)})
    flow_id = 0
    for items in groups.values():
        for item in items:
            if item.flow_from is None or id(item.flow_from) not in track_of:
                continue
            flow_id += 1
            parent = item.flow_from.span
            at = min(max(item.span.start_time, parent.start_time), parent.end_time)  # inside the request
            fpid, ftid = track_of[id(item.flow_from)]
            cpid, ctid = track_of[id(item)]
            common = {"name": "attributed call", "cat": "attribution", "id": flow_id}
            events.append({"ph": "s", **common, "ts": us(at), "pid": fpid, "tid": ftid})
            events.append({"ph": "f", "bp": "e", **common, "ts": us(item.span.start_time), "pid": cpid, "tid": ctid})
    for pid, service in services.items():
        events.append({"ph": "M", "name": "process_name", "pid": pid, "tid": 0,
                       "args": {"name": f"{service} (pid {pid})"}})
    return {"traceEvents": events, "displayTimeUnit": "ns",
            "otherData": {"source": "otel-gpu", "epoch_ns_at_zero": zero,
                          "note": "CUDA call durations are host-side enqueue times, not GPU execution."}}


def to_json(obj: dict, indent: Optional[int] = None) -> str:
    return json.dumps(obj, indent=indent, separators=(",", ":") if indent is None else None)
