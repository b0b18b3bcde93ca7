"""Server spans of gRPC calls and HTTP/2 streams: span name `{service}/{method}`, rpc.*
attributes, error status from the gRPC status code, http.route `/{service}/{method}`."""
from opentelemetry.trace import StatusCode

from otel_gpu import semconv as sc
from otel_gpu.pipeline.model import CallSink, Request
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.protocols.http2.grpc import rpc_of
from tests.unit.export.test_spans import PID, T0, TID, builder


def _request(head: RequestHead, status=200, error=None) -> Request:
    return Request(PID, TID, 9, head, T0, trace_id=0xABC, span_id=0xDEF, sink=CallSink(8),
                   end_ns=T0 + 1000, status=status, error=error)


def _grpc(method="Predict", code=0) -> RequestHead:
    head = RequestHead("POST", f"/demo.v1.Inference/{method}", "2", {"content-type": "application/grpc"},
                       protocol="grpc")
    head.rpc = {**rpc_of(head.path), "status_code": code}
    return head


def test_grpc_span_name_rpc_attributes_and_route():
    [server] = builder().build(_request(_grpc()))
    assert server.name == "demo.v1.Inference/Predict"
    a = server.attributes
    assert (a[sc.RPC_SYSTEM], a[sc.RPC_SERVICE], a[sc.RPC_METHOD], a[sc.RPC_GRPC_STATUS_CODE]) == (
        "grpc", "demo.v1.Inference", "Predict", 0)
    assert a[sc.HTTP_ROUTE] == "/demo.v1.Inference/Predict"
    assert a[sc.NETWORK_PROTOCOL_VERSION] == "2"
    assert server.status.status_code is StatusCode.UNSET


def test_grpc_server_error_codes_make_an_error_span_and_client_errors_do_not():
    [internal] = builder().build(_request(_grpc("Fail", 13)))
    assert internal.status.status_code is StatusCode.ERROR and internal.attributes[sc.ERROR_TYPE] == "13"
    [not_found] = builder().build(_request(_grpc("Missing", 5)))
    assert not_found.status.status_code is StatusCode.UNSET
    assert not_found.attributes[sc.RPC_GRPC_STATUS_CODE] == 5


def test_grpc_without_a_status_code_has_no_status_attribute():
    [span] = builder().build(_request(_grpc(code=None), error="gRPC response without grpc-status"))
    assert sc.RPC_GRPC_STATUS_CODE not in span.attributes
    assert span.status.status_code is StatusCode.ERROR


def test_plain_h2_stream_keeps_http_naming():
    [span] = builder().build(_request(RequestHead("GET", "/infer/7", "2", {}, protocol="h2")))
    assert span.name == "GET /infer/{id}"
    assert sc.RPC_SYSTEM not in span.attributes
