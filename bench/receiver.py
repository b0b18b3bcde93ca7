"""The tests' real OTLP/gRPC receiver, counting instead of keeping every span:
spans, serialized bytes (ExportTraceServiceRequest.ByteSize()), and the server
spans' attributes with their direct child counts."""
from __future__ import annotations

import threading
from collections import Counter

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2

from otel_gpu import semconv
from tests.fakes.otlp_receiver import OtlpReceiver, _attrs

SERVER = 2  # SpanKind SERVER in OTLP


class CountingReceiver(OtlpReceiver):
    def __init__(self) -> None:
        super().__init__()
        self.lock = threading.Lock()
        self.reset()

    def reset(self) -> None:
        with self.lock:
            self.span_count = 0
            self.bytes = 0
            self.exports = 0
            self.servers: dict[bytes, dict] = {}   # span_id -> attributes
            self.child_names: Counter = Counter()  # (parent span_id, is rollup) -> children

    def Export(self, request, context):
        size = request.ByteSize()
        with self.lock:
            self.exports += 1
            self.bytes += size
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        self.span_count += 1
                        if s.kind == SERVER:
                            self.servers[s.span_id] = _attrs(s.attributes)
                        elif s.parent_span_id:
                            rollup = any(kv.key == semconv.GPU_ROLLUP_COUNT for kv in s.attributes)
                            self.child_names[(s.parent_span_id, rollup)] += 1
        return trace_service_pb2.ExportTraceServiceResponse()

    def server_span(self, path: str):
        """(span_id, attributes) of the first server span received for url.path `path`, or None."""
        with self.lock:
            return next(((sid, a) for sid, a in self.servers.items() if a.get(semconv.URL_PATH) == path), None)

    def children_of(self, span_id: bytes) -> tuple[int, int]:
        """(single-call children, rollup children) of one span."""
        with self.lock:
            return self.child_names[(span_id, False)], self.child_names[(span_id, True)]
