"""The tests' real OTLP/gRPC receiver, counting instead of keeping every span:
spans, serialized bytes (ExportTraceServiceRequest.ByteSize()), the server
spans' attributes with their direct child counts, each server span's delay
(arrival, wall clock, minus its end_time_unix_nano), and at each metrics export
its arrival and the requests it counts (http.server.request.duration)."""
from __future__ import annotations

import threading
import time
from collections import Counter

from opentelemetry.proto.collector.trace.v1 import trace_service_pb2
from opentelemetry.proto.metrics.v1 import metrics_pb2

from otel_gpu import semconv
from tests.support.otlp_receiver import OtlpReceiver, _attrs

SERVER = 2  # SpanKind SERVER in OTLP
REQUEST_DURATION = "http.server.request.duration"


class MetricExports(list):
    """Takes the base receiver's place for every ExportMetricsServiceRequest (it calls
    append): keeps (arrival wall time, requests counted so far on `route`, and those the
    kernel summarised: no route) only."""

    def __init__(self, route: str = "/work") -> None:
        super().__init__()
        self.route, self.delta_total = route, 0

    def append(self, request) -> None:
        arrived, count = time.time(), 0
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name == REQUEST_DURATION:
                        n = sum(p.count for p in m.histogram.data_points
                                if _counts(_attrs(p.attributes), self.route))
                        if m.histogram.aggregation_temporality == metrics_pb2.AGGREGATION_TEMPORALITY_DELTA:
                            self.delta_total += n
                            n = self.delta_total
                        count += n
        super().append((arrived, count))


def _counts(attrs: dict, route: str) -> bool:
    return attrs.get(semconv.HTTP_ROUTE) == route or attrs.get(semconv.GPU_REQUEST_SUMMARISED) is True


class CountingReceiver(OtlpReceiver):
    def __init__(self, route: str = "/work") -> None:
        """`route`: the requests the metrics count (requests_counted)."""
        super().__init__()
        self.lock = threading.Lock()
        self.route = route
        self.reset()

    def reset(self, since_ns: int = 0) -> None:
        """Forget what came so far; from now on count only spans that end at or after
        since_ns (epoch ns): an earlier phase's spans may still sit in the exporter's batch."""
        with self.lock:
            self.since_ns = since_ns
            self.span_count = 0
            self.bytes = 0
            self.exports = 0
            self.servers: dict[bytes, dict] = {}   # span_id -> attributes
            self.server_delays: list[float] = []   # arrival - end, seconds, per server span
            self.child_names: Counter = Counter()  # (parent span_id, is rollup) -> children
        with self._cond:
            self.metric_requests = MetricExports(self.route)  # (arrival, requests counted), per metrics export

    def Export(self, request, context):
        size, arrived_ns = request.ByteSize(), time.time_ns()
        with self.lock:
            self.exports += 1
            self.bytes += size
            for rs in request.resource_spans:
                for ss in rs.scope_spans:
                    for s in ss.spans:
                        if s.end_time_unix_nano < self.since_ns:
                            continue
                        self.span_count += 1
                        if s.kind == SERVER:
                            self.servers[s.span_id] = _attrs(s.attributes)
                            self.server_delays.append((arrived_ns - s.end_time_unix_nano) / 1e9)
                        elif s.parent_span_id:
                            rollup = any(kv.key == semconv.GPU_ROLLUP_COUNT for kv in s.attributes)
                            self.child_names[(s.parent_span_id, rollup)] += 1
        return trace_service_pb2.ExportTraceServiceResponse()

    def requests_counted(self) -> list[tuple[float, int]]:
        """(arrival wall time, requests counted) of each metrics export since reset()."""
        with self._cond:
            return list(self.metric_requests)

    def server_span(self, path: str):
        """(span_id, attributes) of the first server span received for url.path `path`, or None."""
        with self.lock:
            return next(((sid, a) for sid, a in self.servers.items() if a.get(semconv.URL_PATH) == path), None)

    def children_of(self, span_id: bytes) -> tuple[int, int]:
        """(single-call children, rollup children) of one span."""
        with self.lock:
            return self.child_names[(span_id, False)], self.child_names[(span_id, True)]
