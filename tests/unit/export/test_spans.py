"""SpanBuilder: SDK ReadableSpans from stitched Requests and ProcessWindows."""
import random

import pytest
from opentelemetry.sdk.resources import Resource
from opentelemetry.trace import SpanKind, StatusCode

from otel_gpu import semconv as sc
from otel_gpu.clock import BpfClock
from otel_gpu.export.spans import SpanBuilder
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.model import CallSink, ProcessWindow, Request
from otel_gpu.enrich.routes import RouteTemplater
from otel_gpu.cuda_calls import call_id
from tests.unit.pipeline.calls import cuda

PID, TID = 321, 322
KERNEL = "void gemm<float>(float*, int)"
T0 = 5_000_000_000


class Enriched:
    """The builder fed records as the enrich stage leaves them."""

    def __init__(self, b: SpanBuilder) -> None:
        self.b, self.clock = b, b.clock

    def build(self, r):
        if isinstance(r, (Request, ProcessWindow)):
            r.resource = Resource({"service.name": "infer-svc", "process.pid": r.tgid})
            r.kernel_names = {f: KERNEL for f in r.sink.kernel_funcs()}
            if isinstance(r, Request):
                r.route = RouteTemplater().route(r.head.path)
        return self.b.build(r)


def builder(**kw):
    return Enriched(SpanBuilder(BpfClock(), ids=random.Random(3), **kw))


def call(name, ts, tid=TID, ret=0, nbytes=0, kind=0, stream=0x5, duration=2000):
    return cuda(name, tid, 0xBEEF, nbytes, kind, PID, duration, ts=ts, ret=ret, grid=(8, 1, 1),
                block=(128, 1, 1), stream=stream)


CALL_LAUNCH_KERNEL, CALL_MEMCPY, CALL_MALLOC = "cudaLaunchKernel", "cudaMemcpy", "cudaMalloc"


def request(target="/infer/42?model=a", status=200, error=None, parent=None, peer=("10.0.0.5", 5555),
            port=8080, calls=None, budget=256):
    sink = CallSink(budget)
    for c, attribution in calls or [(call(CALL_LAUNCH_KERNEL, T0 + 100), "thread"),
                                    (call(CALL_MEMCPY, T0 + 200, nbytes=4096, kind=1, stream=0), "thread"),
                                    (call(CALL_MALLOC, T0 + 300, tid=999, nbytes=1 << 20), "process")]:
        sink.add(c, attribution)
    r = Request(PID, TID, 9, RequestHead("GET", target, "1.1", {}), T0, trace_id=0xABC, span_id=0xDEF,
                sink=sink, peer_addr=peer[0] if peer else None, peer_port=peer[1] if peer else None,
                server_port=port, end_ns=T0 + 1_000_000, status=status, error=error)
    if parent:
        r.trace_id, r.parent_span_id = parent
    return r


def test_server_span():
    b = builder()
    spans = b.build(request())
    server = spans[0]
    assert server.kind == SpanKind.SERVER
    assert server.name == "GET /infer/{id}"
    a = server.attributes
    assert a[sc.HTTP_REQUEST_METHOD] == "GET"
    assert a[sc.URL_PATH] == "/infer/42"
    assert a[sc.HTTP_ROUTE] == "/infer/{id}"
    assert a[sc.HTTP_RESPONSE_STATUS_CODE] == 200
    assert a[sc.NETWORK_PROTOCOL_VERSION] == "1.1"
    assert a[sc.PROCESS_PID] == PID and a[sc.THREAD_ID] == TID
    assert a[sc.CLIENT_ADDRESS] == "10.0.0.5" and a[sc.CLIENT_PORT] == 5555
    assert a[sc.SERVER_PORT] == 8080
    assert sc.URL_QUERY not in a
    assert a[sc.GPU_LAUNCHES] == 1 and a[sc.GPU_MEMCPY_H2D_BYTES] == 4096 and a[sc.GPU_CALLS] == 3
    assert a[sc.GPU_DISTINCT_KERNELS] == 1 and a[sc.GPU_SPANS_DROPPED] == 0
    assert server.parent is None
    assert server.status.status_code == StatusCode.UNSET
    assert (server.context.trace_id, server.context.span_id) == (0xABC, 0xDEF)
    assert server.end_time - server.start_time == 1_000_000
    assert abs(server.start_time - b.clock.to_epoch_ns(T0)) == 0
    assert server.resource.attributes["service.name"] == "infer-svc"


def test_optional_attributes_absent():
    a = builder().build(request(peer=None, port=None, status=None, error="x"))[0].attributes
    assert sc.CLIENT_ADDRESS not in a and sc.SERVER_PORT not in a
    assert sc.HTTP_RESPONSE_STATUS_CODE not in a


def test_query_exported_only_when_configured():
    assert builder(export_query=True).build(request())[0].attributes[sc.URL_QUERY] == "model=a"
    assert sc.URL_QUERY not in builder(export_query=True).build(request("/x"))[0].attributes


def test_configured_headers_exported_as_arrays():
    r = request()
    r.head.headers["x-tenant"] = "acme"
    r.head.headers["authorization"] = "Bearer t"
    a = builder(export_headers=frozenset({"x-tenant"})).build(r)[0].attributes
    assert a["http.request.header.x-tenant"] == ("acme",)
    assert not any("authorization" in k for k in a)


def test_children_parented_to_the_server_span():
    spans = builder().build(request())
    server, children = spans[0], spans[1:]
    assert [c.name for c in children] == ["cudaLaunchKernel", "cudaMemcpy", "cudaMalloc"]
    assert len({c.context.span_id for c in spans}) == 4
    for c in children:
        assert c.parent.span_id == server.context.span_id
        assert c.context.trace_id == server.context.trace_id == 0xABC
        assert c.kind == SpanKind.INTERNAL
        assert c.attributes[sc.GPU_TIMING] == "host_enqueue"
        assert c.start_time >= server.start_time
    launch, memcpy, malloc = (c.attributes for c in children)
    assert launch[sc.GPU_ATTRIBUTION] == "thread" and malloc[sc.GPU_ATTRIBUTION] == "process"
    assert launch[sc.GPU_KERNEL_NAME] == KERNEL and launch[sc.GPU_KERNEL_FUNC] == "0xbeef"
    assert tuple(launch[sc.GPU_GRID]) == (8, 1, 1) and tuple(launch[sc.GPU_BLOCK]) == (128, 1, 1)
    assert memcpy[sc.GPU_MEMCPY_BYTES] == 4096 and memcpy[sc.GPU_MEMCPY_DIRECTION] == "h2d"
    assert malloc[sc.GPU_ALLOC_BYTES] == 1 << 20 and malloc[sc.THREAD_ID] == 999
    assert children[0].end_time == children[0].start_time  # launches: entry only
    assert children[2].end_time - children[2].start_time == 2000  # cudaMalloc: entry to return


def test_failed_cuda_call_has_error_status():
    r = request(calls=[(call(CALL_LAUNCH_KERNEL, T0 + 1, ret=35), "thread")])
    child = builder().build(r)[1]
    assert child.status.status_code == StatusCode.ERROR
    assert child.attributes[sc.GPU_CUDA_RETURN_CODE] == 35


def test_rollups_become_counted_children():
    calls = [(call(CALL_LAUNCH_KERNEL, T0 + i), "thread") for i in range(7)]
    r = request(calls=calls, budget=2)
    spans = builder().build(r)
    assert len(spans) == 1 + 2 + 1
    rollup = spans[-1]
    assert rollup.name == "cudaLaunchKernel x5"
    assert rollup.attributes[sc.GPU_ROLLUP_COUNT] == 5
    assert rollup.attributes[sc.GPU_KERNEL_NAME] == KERNEL
    assert rollup.attributes[sc.GPU_TIMING] == "host_enqueue"
    assert spans[0].attributes[sc.GPU_SPANS_DROPPED] == 5
    assert rollup.parent.span_id == spans[0].context.span_id


def test_remote_parent_from_traceparent():
    server = builder().build(request(parent=(0x1234, 0x5678)))[0]
    assert server.parent is not None and server.parent.is_remote
    assert (server.parent.trace_id, server.parent.span_id) == (0x1234, 0x5678)
    assert server.context.trace_id == 0x1234


@pytest.mark.parametrize("status,error,code,etype", [
    (500, None, StatusCode.ERROR, "500"),
    (503, None, StatusCode.ERROR, "503"),
    (404, None, StatusCode.UNSET, None),
    (None, "connection closed before the response completed", StatusCode.ERROR, "incomplete"),
    (200, "process exited", StatusCode.ERROR, "200"),
])
def test_error_status(status, error, code, etype):
    server = builder().build(request(status=status, error=error))[0]
    assert server.status.status_code == code
    assert server.attributes.get(sc.ERROR_TYPE) == etype
    if error:
        assert server.status.description == error


def test_process_window_links_to_candidates():
    sink = CallSink(10)
    sink.add(call(CALL_LAUNCH_KERNEL, T0 + 5, tid=7), "ambiguous")
    sink.summary.ambiguous = 0
    w = ProcessWindow(PID, "ambiguous", T0, T0 + 50, sink, candidates=[(0xA1, 0xB1), (0xA2, 0xB2)])
    spans = builder().build(w)
    span = spans[0]
    assert span.name == "GPU work, ambiguous request" and span.parent is None
    assert [(l.context.trace_id, l.context.span_id) for l in span.links] == [(0xA1, 0xB1), (0xA2, 0xB2)]
    assert span.attributes[sc.GPU_CANDIDATE_REQUESTS] == 2
    assert span.attributes[sc.GPU_ATTRIBUTION] == "ambiguous"
    assert span.context.trace_id not in (0xA1, 0xA2)
    (child,) = spans[1:]
    assert child.parent.span_id == span.context.span_id
    assert child.attributes[sc.GPU_ATTRIBUTION] == "ambiguous"


def test_outside_window_without_links():
    w = ProcessWindow(PID, "outside", T0, T0 + 50, CallSink(10))
    w.sink.add_aggregate(call_id(CALL_LAUNCH_KERNEL), 0xBEEF, 9, 0, 0, T0 + 10, "outside")
    span, rollup = builder().build(w)
    assert span.name == "GPU work outside requests" and list(span.links) == []
    assert sc.GPU_CANDIDATE_REQUESTS not in span.attributes
    assert span.attributes[sc.GPU_LAUNCHES] == 9
    assert rollup.attributes[sc.GPU_ROLLUP_COUNT] == 9


def test_unknown_records_build_nothing():
    assert builder().build(object()) == []


def test_url_scheme_is_https_for_a_request_read_through_the_ssl_probes():
    plain, secure = request(), request()
    secure.tls = True
    assert builder().build(plain)[0].attributes[sc.URL_SCHEME] == "http"
    assert builder().build(secure)[0].attributes[sc.URL_SCHEME] == "https"


def test_a_request_begun_before_its_probes_says_so_and_others_do_not():
    late = request()
    late.before_probes = True
    assert builder().build(late)[0].attributes[sc.GPU_CALLS_BEFORE_PROBES] is True
    assert sc.GPU_CALLS_BEFORE_PROBES not in builder().build(request())[0].attributes
