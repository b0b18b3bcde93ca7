"""A real OTLP/gRPC receiver on 127.0.0.1 (the collector protocol's own generated
services), keeping every span it is sent, and the names of the metrics, for assertions."""
from __future__ import annotations

import threading
from concurrent import futures
from dataclasses import dataclass, field

import grpc
from opentelemetry.proto.collector.metrics.v1 import metrics_service_pb2, metrics_service_pb2_grpc
from opentelemetry.proto.collector.trace.v1 import trace_service_pb2, trace_service_pb2_grpc


def _value(v):
    kind = v.WhichOneof("value")
    if kind == "array_value":
        return [_value(x) for x in v.array_value.values]
    return getattr(v, kind) if kind else None


def _attrs(kvs) -> dict:
    return {kv.key: _value(kv.value) for kv in kvs}


@dataclass
class ReceivedSpan:
    name: str
    kind: int
    trace_id: str
    span_id: str
    parent_span_id: str
    start_ns: int
    end_ns: int
    attributes: dict
    resource: dict
    status_code: int
    links: list
    link_attributes: list = field(default_factory=list)  # aligned with links
    status_message: str = ""  # an error's description (the request's error: pipeline/connections.py)


class OtlpReceiver(trace_service_pb2_grpc.TraceServiceServicer):
    def __init__(self, port: int = 0) -> None:
        self.spans: list[ReceivedSpan] = []
        self._cond = threading.Condition()
        self.server = grpc.server(futures.ThreadPoolExecutor(max_workers=4))
        trace_service_pb2_grpc.add_TraceServiceServicer_to_server(self, self.server)
        self.metric_names: set[str] = set()
        self.metric_requests: list = []  # every ExportMetricsServiceRequest, for values
        metrics_service_pb2_grpc.add_MetricsServiceServicer_to_server(_Metrics(self), self.server)
        self.port = self.server.add_insecure_port(f"127.0.0.1:{port}")
        assert self.port, f"cannot bind 127.0.0.1:{port}"

    def Export(self, request, context):
        self.keep(request)
        return trace_service_pb2.ExportTraceServiceResponse()

    def keep(self, request) -> None:
        got = []
        for rs in request.resource_spans:
            res = _attrs(rs.resource.attributes)
            for ss in rs.scope_spans:
                for s in ss.spans:
                    got.append(ReceivedSpan(
                        s.name, s.kind, s.trace_id.hex(), s.span_id.hex(), s.parent_span_id.hex(),
                        s.start_time_unix_nano, s.end_time_unix_nano, _attrs(s.attributes), res,
                        s.status.code, [(l.trace_id.hex(), l.span_id.hex()) for l in s.links],
                        [_attrs(l.attributes) for l in s.links], s.status.message))
        with self._cond:
            self.spans.extend(got)
            self._cond.notify_all()

    @property
    def endpoint(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> "OtlpReceiver":
        self.server.start()
        return self

    def stop(self) -> None:
        self.server.stop(0)

    def wait_for(self, predicate, timeout: float = 20.0) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: predicate(self.spans), timeout)

    def clear(self) -> None:
        """Forgets the spans received so far (a receiver shared by consecutive tests)."""
        with self._cond:
            self.spans.clear()


class _Metrics(metrics_service_pb2_grpc.MetricsServiceServicer):
    def __init__(self, receiver: OtlpReceiver) -> None:
        self.receiver = receiver

    def Export(self, request, context):
        names = {m.name for rm in request.resource_metrics for sm in rm.scope_metrics for m in sm.metrics}
        with self.receiver._cond:
            self.receiver.metric_names |= names
            self.receiver.metric_requests.append(request)
            self.receiver._cond.notify_all()
        return metrics_service_pb2.ExportMetricsServiceResponse()


class OtlpHttpReceiver(OtlpReceiver):
    """The same, over OTLP/HTTP with protobuf bodies (POST /v1/traces, /v1/metrics)."""

    def __init__(self) -> None:
        super().__init__()
        from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def log_message(self, *a):
                pass

            def do_POST(self):
                body = self.rfile.read(int(self.headers.get("Content-Length", 0)))
                if self.path == "/v1/traces" and self.headers.get("Content-Type") == "application/x-protobuf":
                    receiver.keep(trace_service_pb2.ExportTraceServiceRequest.FromString(body))
                    reply = trace_service_pb2.ExportTraceServiceResponse().SerializeToString()
                elif self.path == "/v1/metrics":
                    reply = metrics_service_pb2.ExportMetricsServiceResponse().SerializeToString()
                else:
                    self.send_error(404)
                    return
                self.send_response(200)
                self.send_header("Content-Type", "application/x-protobuf")
                self.send_header("Content-Length", str(len(reply)))
                self.end_headers()
                self.wfile.write(reply)

        self.http = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.port = self.http.server_address[1]

    def start(self) -> "OtlpHttpReceiver":
        threading.Thread(target=self.http.serve_forever, daemon=True).start()
        return self

    def stop(self) -> None:
        self.http.shutdown()
        self.http.server_close()
