"""Builds OTel SDK ReadableSpans (explicit ids and times) from stitched records."""
from __future__ import annotations

from typing import Callable, Optional

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .. import __version__
from .. import semconv as sc
from ..clock import BpfClock
from ..pipeline.events import (CudaCall, CALL_NAMES, KERNEL_LAUNCH_CALLS, MEMCPY_CALLS,
                               MEMCPY_DIRECTIONS, CALL_MALLOC)
from ..pipeline.model import CallSink, ProcessWindow, Request
from ..pipeline.routes import RouteTemplater

SCOPE = InstrumentationScope("otel-gpu", __version__)
SAMPLED = TraceFlags(TraceFlags.SAMPLED)

KernelNamer = Callable[[int, int], Optional[str]]  # (pid, func) -> demangled name


def _ctx(trace_id: int, span_id: int, remote: bool = False) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=SAMPLED)


class SpanBuilder:
    def __init__(self, clock: BpfClock, routes: RouteTemplater, resource_for,
                 kernel_name: KernelNamer, export_query: bool = False,
                 export_headers: frozenset = frozenset(), ids=None, currency: str = "USD") -> None:
        import random
        self.clock = clock
        self.routes = routes
        self.resource_for = resource_for
        self.kernel_name = kernel_name
        self.export_query = export_query
        self.export_headers = export_headers
        self._rng = ids or random.Random()
        self.currency = currency

    def build(self, record) -> list[ReadableSpan]:
        if isinstance(record, Request):
            return self._request(record)
        if isinstance(record, ProcessWindow):
            return self._window(record)
        return []

    def _request(self, r: Request) -> list[ReadableSpan]:
        route = self.routes.route(r.head.path)
        resource = self.resource_for(r.tgid)
        summary = r.sink.summary
        attrs = {
            sc.HTTP_REQUEST_METHOD: r.head.method,
            sc.URL_PATH: r.head.path,
            sc.HTTP_ROUTE: route,
            sc.NETWORK_PROTOCOL_VERSION: r.head.version,
            sc.URL_SCHEME: "http",
            sc.PROCESS_PID: r.tgid,
            sc.THREAD_ID: r.tid,
        }
        if self.export_query and r.head.query is not None:
            attrs[sc.URL_QUERY] = r.head.query
        for name in self.export_headers:
            if name in r.head.headers:
                attrs[f"http.request.header.{name}"] = (r.head.headers[name],)
        if r.peer_addr:
            attrs[sc.CLIENT_ADDRESS] = r.peer_addr
            attrs[sc.CLIENT_PORT] = r.peer_port
        if r.server_port:
            attrs[sc.SERVER_PORT] = r.server_port
        if r.status is not None:
            attrs[sc.HTTP_RESPONSE_STATUS_CODE] = r.status
        attrs.update(summary_attributes(summary))
        attrs[sc.GPU_SPANS_DROPPED] = r.sink.rolled_up
        if r.gpu_seconds is not None:  # host-side estimate, see pipeline/cost.py
            attrs[sc.GPU_COST_SECONDS] = r.gpu_seconds
            attrs[sc.GPU_COST_AMOUNT] = r.cost
            attrs[sc.GPU_COST_CURRENCY] = self.currency
        if r.feature is not None:
            attrs[sc.GPU_FEATURE] = r.feature
        if r.busy.device is not None:
            attrs[sc.GPU_DEVICE] = r.busy.device
        if r.error:
            status = Status(StatusCode.ERROR, r.error)
            attrs[sc.ERROR_TYPE] = "incomplete" if r.status is None else str(r.status)
        elif r.status is not None and r.status >= 500:
            status = Status(StatusCode.ERROR)
            attrs[sc.ERROR_TYPE] = str(r.status)
        else:
            status = Status(StatusCode.UNSET)
        parent = _ctx(r.trace_id, r.parent_span_id, remote=True) if r.parent_span_id else None
        server = ReadableSpan(
            name=f"{r.head.method} {route}", context=_ctx(r.trace_id, r.span_id), parent=parent,
            resource=resource, attributes=attrs, kind=SpanKind.SERVER, status=status,
            start_time=self.clock.to_epoch_ns(r.start_ns), end_time=self.clock.to_epoch_ns(r.end_ns),
            instrumentation_scope=SCOPE)
        return [server] + self._children(r.tgid, r.trace_id, r.span_id, r.sink, resource)

    def _window(self, w: ProcessWindow) -> list[ReadableSpan]:
        resource = self.resource_for(w.tgid)
        trace_id = self._rng.getrandbits(128) or 1
        span_id = self._rng.getrandbits(64) or 1
        attrs = {sc.PROCESS_PID: w.tgid, sc.GPU_ATTRIBUTION: w.attribution,
                 **summary_attributes(w.sink.summary)}
        links = [Link(_ctx(t, s)) for t, s in w.candidates]
        if w.candidates:
            attrs[sc.GPU_CANDIDATE_REQUESTS] = len(w.candidates)
        name = "GPU work, ambiguous request" if w.attribution == "ambiguous" else "GPU work outside requests"
        span = ReadableSpan(
            name=name, context=_ctx(trace_id, span_id), parent=None, resource=resource,
            attributes=attrs, links=links, kind=SpanKind.INTERNAL,
            start_time=self.clock.to_epoch_ns(w.start_ns), end_time=self.clock.to_epoch_ns(w.end_ns),
            instrumentation_scope=SCOPE)
        return [span] + self._children(w.tgid, trace_id, span_id, w.sink, resource)

    def _children(self, pid, trace_id, parent_id, sink: CallSink, resource) -> list[ReadableSpan]:
        parent = _ctx(trace_id, parent_id)
        spans = []
        for call, attribution in sink.calls:
            attrs = self._call_attributes(pid, call)
            attrs[sc.GPU_ATTRIBUTION] = attribution
            attrs[sc.THREAD_ID] = call.tid
            start = self.clock.to_epoch_ns(call.ts_ns)
            spans.append(ReadableSpan(
                name=call.name, context=_ctx(trace_id, self._rng.getrandbits(64) or 1), parent=parent,
                resource=resource, attributes=attrs, kind=SpanKind.INTERNAL,
                status=Status(StatusCode.ERROR, f"CUDA error {call.ret}") if call.ret > 0 else Status(StatusCode.UNSET),
                start_time=start, end_time=start + call.duration_ns, instrumentation_scope=SCOPE))
        for agg in sink.rollups.values():
            attrs = {sc.GPU_CUDA_CALL: CALL_NAMES.get(agg.call, str(agg.call)),
                     sc.GPU_ROLLUP_COUNT: agg.count, sc.GPU_ROLLUP_BYTES: agg.bytes,
                     sc.GPU_ROLLUP_DURATION_NS: agg.duration_ns, sc.GPU_TIMING: "host_enqueue"}
            if agg.call in KERNEL_LAUNCH_CALLS:
                attrs.update(self._kernel_attributes(pid, agg.func))
            elif agg.call in MEMCPY_CALLS:  # rollups keep the direction in `func`
                attrs[sc.GPU_MEMCPY_DIRECTION] = MEMCPY_DIRECTIONS.get(agg.func, "default")
            spans.append(ReadableSpan(
                name=f"{CALL_NAMES.get(agg.call, agg.call)} x{agg.count}",
                context=_ctx(trace_id, self._rng.getrandbits(64) or 1), parent=parent,
                resource=resource, attributes=attrs, kind=SpanKind.INTERNAL,
                start_time=self.clock.to_epoch_ns(agg.first_ts),
                end_time=self.clock.to_epoch_ns(max(agg.last_end_ts, agg.last_ts)),
                instrumentation_scope=SCOPE))
        return spans

    def _kernel_attributes(self, pid: int, func: int) -> dict:
        attrs = {sc.GPU_KERNEL_FUNC: hex(func)}
        name = self.kernel_name(pid, func)
        if name:
            attrs[sc.GPU_KERNEL_NAME] = name
        return attrs

    def _call_attributes(self, pid: int, c: CudaCall) -> dict:
        attrs = {sc.GPU_CUDA_CALL: c.name, sc.GPU_TIMING: "host_enqueue"}
        if c.ret >= 0:
            attrs[sc.GPU_CUDA_RETURN_CODE] = c.ret
        if c.call in KERNEL_LAUNCH_CALLS:
            attrs.update(self._kernel_attributes(pid, c.func))
            attrs[sc.GPU_GRID] = list(c.grid)
            attrs[sc.GPU_BLOCK] = list(c.block)
            attrs[sc.GPU_SHARED_MEMORY_BYTES] = c.shmem
            attrs[sc.GPU_STREAM] = hex(c.stream)
        elif c.call in MEMCPY_CALLS:
            attrs[sc.GPU_MEMCPY_BYTES] = c.bytes
            attrs[sc.GPU_MEMCPY_DIRECTION] = MEMCPY_DIRECTIONS.get(c.kind, "default")
            if c.stream:
                attrs[sc.GPU_STREAM] = hex(c.stream)
        elif c.call == CALL_MALLOC:
            attrs[sc.GPU_ALLOC_BYTES] = c.bytes
        elif c.stream:
            attrs[sc.GPU_STREAM] = hex(c.stream)
        return attrs


def summary_attributes(s) -> dict:
    b = s.memcpy_bytes
    return {
        sc.GPU_CALLS: s.calls,
        sc.GPU_LAUNCHES: s.launches,
        sc.GPU_MEMCPY_H2D_BYTES: b.get("h2d", 0),
        sc.GPU_MEMCPY_D2H_BYTES: b.get("d2h", 0),
        sc.GPU_MEMCPY_D2D_BYTES: b.get("d2d", 0),
        sc.GPU_MEMCPY_OTHER_BYTES: b.get("h2h", 0) + b.get("default", 0),
        sc.GPU_SYNC_DURATION_NS: s.sync_ns,
        sc.GPU_DISTINCT_KERNELS: len(s.kernels),
        sc.GPU_CALLS_AMBIGUOUS: s.ambiguous,
    }
