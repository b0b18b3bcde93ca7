"""Builds OTel SDK ReadableSpans (explicit ids and times) from stitched, enriched
records: everything a span says is on the record (resource, route and kernel names
were written by enrich, cost by the cost stage)."""
from __future__ import annotations

from typing import Optional

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .. import __version__
from .. import semconv as sc
from ..clock import BpfClock
from ..cuda_calls import MEMCPY_DIRECTIONS, Category, call_name
from ..pipeline import sampling
from ..pipeline.model import CallSink, ProcessWindow, Request
from ..pipeline.protocols.http2.grpc import SERVER_ERROR_CODES
from ..probes import nccl
from .call_attributes import (api_label, call_attributes, call_keys, category_of, device_attributes,
                              graph_kernel_attributes, kernel_attributes, summary_attributes)

SCOPE = InstrumentationScope("otel-gpu", __version__)
SAMPLED, UNSAMPLED = TraceFlags(TraceFlags.SAMPLED), TraceFlags(TraceFlags.DEFAULT)
UNSET = Status(StatusCode.UNSET)  # immutable: one for every span without an error
# Span names of the windows of calls no single request owns, by attribution.
WINDOW_NAMES = {"ambiguous": "GPU work, ambiguous request", "shared": "GPU work, shared by requests",
                "outside": "GPU work outside requests"}


def _ctx(trace_id: int, span_id: int, remote: bool = False, sampled: bool = True) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=SAMPLED if sampled else UNSAMPLED)


class SpanBuilder:
    def __init__(self, clock: BpfClock, export_query: bool = False,
                 export_headers: frozenset = frozenset(), ids=None, currency: str = "USD",
                 sampler=None, stats=None, max_links: int = 128) -> None:
        import random
        self.clock = clock
        self.max_links = max_links  # OTEL_SPAN_LINK_COUNT_LIMIT (config.py)
        self.sampler = sampler  # pipeline/sampling.py; None: every trace is sampled
        self.stats = stats
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
        server = self.server_span(r)
        return [server] + self._children(r, r.trace_id, r.span_id, server.context.trace_flags.sampled)

    def server_span(self, r: Request) -> ReadableSpan:
        """The request's SERVER span alone: all a summary needs (store/summaries.py)."""
        route = r.route or r.head.path
        resource = r.resource
        summary = r.sink.summary
        attrs = {
            sc.HTTP_REQUEST_METHOD: r.head.method,
            sc.URL_PATH: r.head.path,
            sc.HTTP_ROUTE: route,
            sc.NETWORK_PROTOCOL_VERSION: r.head.version,
            sc.URL_SCHEME: "https" if r.tls else "http",
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
        if r.chunks:
            attrs[sc.GPU_RESPONSE_CHUNKS] = r.chunks
        if r.untracked_connections:
            attrs[sc.GPU_CONNECTIONS_UNTRACKED] = r.untracked_connections
        if r.lost_while_open:
            attrs[sc.GPU_RECORDS_LOST] = r.lost_while_open
        if r.before_probes:
            attrs[sc.GPU_CALLS_BEFORE_PROBES] = True
        if r.gpu_seconds is not None:  # host-side estimate, see pipeline/cost.py
            attrs[sc.GPU_COST_SECONDS] = r.gpu_seconds
            attrs[sc.GPU_COST_AMOUNT] = r.cost
            attrs[sc.GPU_COST_CURRENCY] = self.currency
            attrs[sc.GPU_COST_SOURCE] = r.cost_source
        elif r.cost_pending:
            attrs[sc.GPU_COST_PENDING] = True
        if r.feature is not None:
            attrs[sc.GPU_FEATURE] = r.feature
        if r.time_split is not None:  # pipeline/time_split.py
            attrs.update(zip(sc.TIME_ATTRIBUTES, (ns / 1e9 for ns in r.time_split)))
            if r.time_shared:
                attrs[sc.GPU_TIME_SHARED] = True
        if r.queued_ns is not None:
            attrs[sc.GPU_TIME_QUEUED] = r.queued_ns / 1e9
        if r.busy.device is not None:
            attrs[sc.GPU_DEVICE] = r.busy.device
        if r.device_identity is not None:  # only what is certain (otel_gpu/gpu_devices.py)
            if r.device_identity.uuid:
                attrs[sc.GPU_DEVICE_UUID] = r.device_identity.uuid
            if r.device_identity.model:
                attrs[sc.GPU_DEVICE_MODEL] = r.device_identity.model
        rpc_attributes(r.head.rpc, attrs)
        status, error_type = request_status(r)
        if error_type is not None:
            attrs[sc.ERROR_TYPE] = error_type
        name = server_span_name(r.head, route)
        on = self.counted(r.sampled)  # decided as it opened (pipeline/stitcher.py)
        parent = _ctx(r.trace_id, r.parent_span_id, True, bool(r.parent_sampled)) if r.parent_span_id else None
        return ReadableSpan(
            name=name, context=_ctx(r.trace_id, r.span_id, sampled=on), parent=parent,
            resource=resource, attributes=int64_safe(attrs), kind=SpanKind.SERVER, status=status,
            start_time=self.clock.to_epoch_ns(r.start_ns), end_time=self.clock.to_epoch_ns(r.end_ns),
            instrumentation_scope=SCOPE)

    def _window(self, w: ProcessWindow) -> list[ReadableSpan]:
        resource = w.resource
        trace_id = self._rng.getrandbits(128) or 1
        span_id = self._rng.getrandbits(64) or 1
        attrs = {sc.PROCESS_PID: w.tgid, sc.GPU_ATTRIBUTION: w.attribution,
                 **summary_attributes(w.sink.summary)}
        kept, dropped = self._linked(w)
        links = BoundedList.from_seq(len(kept), [
            Link(_ctx(t, s), {sc.GPU_LINK_RULE: w.link_rules[(t, s)]} if (t, s) in w.link_rules else None)
            for t, s in kept])
        links.dropped = len(dropped)  # OTLP's dropped_links_count, as the SDK's own spans say it
        if w.candidates:
            attrs[sc.GPU_CANDIDATE_REQUESTS] = len(w.candidates)
        if w.untracked_connections:
            attrs[sc.GPU_CONNECTIONS_UNTRACKED] = w.untracked_connections
        attrs.update(self._window_cost(w, kept, dropped))
        name = WINDOW_NAMES.get(w.attribution, "GPU work outside requests")
        on = w.links_sampled or self._sampled(trace_id, name, SpanKind.INTERNAL)  # a sampled trace's links resolve
        span = ReadableSpan(
            name=name, context=_ctx(trace_id, span_id, sampled=on), parent=None, resource=resource,
            attributes=int64_safe(attrs), links=links, kind=SpanKind.INTERNAL,
            start_time=self.clock.to_epoch_ns(w.start_ns), end_time=self.clock.to_epoch_ns(w.end_ns),
            instrumentation_scope=SCOPE)
        return [span] + self._children(w, trace_id, span_id, on)

    def _sampled(self, trace_id: int, name: str, kind) -> bool:
        """A window's trace: its own root."""
        return self.counted(self.sampler is None or sampling.sampled(self.sampler, trace_id, name, kind))

    def counted(self, on: bool) -> bool:
        if not on and self.stats is not None:
            self.stats.add("traces_unsampled")  # not sent to OTLP; metrics, cost and the store keep them
        return on

    def _linked(self, w: ProcessWindow) -> tuple[list, list]:
        """(candidates the span links, those it leaves out): all within max_links; past it
        the largest cost shares (the first on a tie), in the window's order."""
        cands = w.candidates
        if len(cands) <= self.max_links:
            return cands, []
        split = w.split
        ranked = sorted(range(len(cands)), key=lambda i: -split.get(cands[i], 0.0))  # stable: first wins ties
        keep = set(ranked[:self.max_links])
        return [c for i, c in enumerate(cands) if i in keep], [c for i, c in enumerate(cands) if i not in keep]

    def _window_cost(self, w: ProcessWindow, kept: list, dropped: list) -> dict:
        """The window's GPU time (pipeline/cost.py), and its split among the candidates
        as lists aligned with the span's links, the dropped links' shares summed by feature:
        what the store reads split rows from."""
        if w.gpu_seconds is None:  # no cost stage ran
            return {}
        attrs = {sc.GPU_COST_SECONDS: w.gpu_seconds, sc.GPU_COST_AMOUNT: w.cost or 0.0,
                 sc.GPU_COST_CURRENCY: self.currency, sc.GPU_COST_SOURCE: w.cost_source}
        feature = lambda c: str(w.split_features.get(c) or "(unknown)")  # noqa: E731
        if kept:
            attrs[sc.GPU_COST_SPLIT_SECONDS] = [float(w.split.get(c, 0.0)) for c in kept]
            attrs[sc.GPU_COST_SPLIT_FEATURES] = [feature(c) for c in kept]
        rest: dict[str, float] = {}
        for c in dropped:
            f = feature(c)
            rest[f] = rest.get(f, 0.0) + float(w.split.get(c, 0.0))
        if rest:
            attrs[sc.GPU_COST_SPLIT_REST_FEATURES] = list(rest)
            attrs[sc.GPU_COST_SPLIT_REST_SECONDS] = list(rest.values())
        return attrs

    def _children(self, record, trace_id: int, parent_id: int, on: bool = True) -> list[ReadableSpan]:
        parent = _ctx(trace_id, parent_id, sampled=on)
        sink: CallSink = record.sink
        names, resource = record.kernel_names, record.resource
        to_epoch_ns, span_id = self.clock.to_epoch_ns, self._rng.getrandbits  # per call: bound once
        spans = []
        for call, attribution in sink.calls:
            attrs = call_attributes(call, names)
            attrs[sc.GPU_ATTRIBUTION] = attribution
            attrs[sc.THREAD_ID] = call.tid
            if call.device_ns:
                attrs.update(device_attributes(call))
            start = to_epoch_ns(call.ts_ns)
            spans.append(ReadableSpan(
                name=call.name, context=_ctx(trace_id, span_id(64) or 1, sampled=on), parent=parent,
                resource=resource, attributes=int64_safe(attrs), kind=SpanKind.INTERNAL,
                status=Status(StatusCode.ERROR, f"{api_label(call.call)} error {call.ret}") if call.ret > 0 else UNSET,
                start_time=start, end_time=start + call.amounts()[2], instrumentation_scope=SCOPE))
        for agg in sink.rollups.values():
            attrs = {call_keys(agg.call)[0]: call_name(agg.call),
                     sc.GPU_ROLLUP_COUNT: agg.count, sc.GPU_ROLLUP_BYTES: agg.bytes,
                     sc.GPU_ROLLUP_DURATION_NS: agg.duration_ns, sc.GPU_TIMING: "host_enqueue"}
            category = category_of(agg.call)
            if category is Category.LAUNCH:
                attrs.update(kernel_attributes(agg.detail, names))
            elif category is Category.MEMCPY:
                attrs[sc.GPU_MEMCPY_DIRECTION] = MEMCPY_DIRECTIONS.get(agg.detail, "default")
            elif category is Category.GRAPH:
                attrs.update(graph_kernel_attributes(agg.kernels, names))
            elif category is Category.COLLECTIVE:
                attrs.update({sc.GPU_NCCL_OP: nccl.op_name(agg.call), sc.GPU_NCCL_COMM: hex(agg.detail)})
            spans.append(ReadableSpan(
                name=f"{call_name(agg.call)} x{agg.count}",
                context=_ctx(trace_id, self._rng.getrandbits(64) or 1, sampled=on), parent=parent,
                resource=resource, attributes=int64_safe(attrs), kind=SpanKind.INTERNAL,
                start_time=self.clock.to_epoch_ns(agg.first_ts),
                end_time=self.clock.to_epoch_ns(max(agg.last_end_ts, agg.last_ts)),
                instrumentation_scope=SCOPE))
        return spans


def request_status(r: Request) -> tuple[Status, Optional[str]]:
    """The SERVER span's status and error.type (None: no error): the request never
    finished (r.error), a gRPC server error code, or an HTTP 5xx."""
    rpc = r.head.rpc
    rpc_status = rpc.get("status_code") if rpc else None
    if r.error:
        return Status(StatusCode.ERROR, r.error), "incomplete" if r.status is None else str(r.status)
    if rpc_status in SERVER_ERROR_CODES:
        return Status(StatusCode.ERROR), str(rpc_status)
    if r.status is not None and r.status >= 500:
        return Status(StatusCode.ERROR), str(r.status)
    return UNSET, None


def ends_in_error(r: Request) -> bool:
    return request_status(r)[0] is not UNSET


def server_span_name(head, route: str) -> str:
    """`{method} {route}`; a gRPC call: `{service}/{method}` (semconv RPC span name)."""
    rpc = head.rpc
    if rpc and rpc.get("service") and rpc.get("method"):
        return f"{rpc['service']}/{rpc['method']}"
    return f"{head.method} {route}"


def rpc_attributes(rpc, attrs: dict) -> None:
    """rpc.* of a gRPC call into `attrs` (nothing: not gRPC). The http.* attributes stay:
    gRPC is HTTP/2 POST, the route is /service/method."""
    if not rpc:
        return
    attrs[sc.RPC_SYSTEM] = rpc["system"]
    for key, name in (("service", sc.RPC_SERVICE), ("method", sc.RPC_METHOD),
                      ("status_code", sc.RPC_GRPC_STATUS_CODE)):
        if rpc.get(key) is not None:
            attrs[name] = rpc[key]


INT64_MIN, INT64_MAX = -2**63, 2**63 - 1


def int64_safe(attrs: dict) -> dict:
    """OTLP integer attributes are int64: a value outside it (a traced process's
    cudaMemcpy of 2^64-1 bytes) is clamped to the nearest bound and the span says so
    (otel_gpu.value_clamped=true), instead of the exporter dropping it with a traceback."""
    for v in attrs.values():  # the common case, nothing out of range: no list built
        if type(v) is int and not INT64_MIN <= v <= INT64_MAX:
            break
    else:
        return attrs
    clamped = [k for k, v in attrs.items() if type(v) is int and not INT64_MIN <= v <= INT64_MAX]
    for k in clamped:
        attrs[k] = INT64_MAX if attrs[k] > 0 else INT64_MIN
    if clamped:
        attrs[sc.GPU_VALUE_CLAMPED] = True
    return attrs
