"""GPU metrics through the official OTel SDK MeterProvider: OTLP when an endpoint is
configured, a Prometheus scrape endpoint as an option. A pipeline stage: it reads
finished requests and process windows, and passes them on unchanged.

Kernel names are bounded: the first `top_kernels` distinct names keep their own
series, later ones are reported as "other". Grid/block/sync histograms sample the
first HISTOGRAM_SAMPLE calls of each request; counters include every call."""
from __future__ import annotations

import logging
import os
from typing import Callable, Optional

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource

from .. import __version__
from .. import semconv as sc
from ..pipeline.events import CALL_FREE, CALL_MALLOC, KERNEL_LAUNCH_CALLS, MEMCPY_CALLS, MEMCPY_DIRECTIONS, SYNC_CALLS
from ..pipeline.model import ProcessWindow, Request
from .sink import otlp_protocol

log = logging.getLogger(__name__)
OTHER = "other"
HISTOGRAM_SAMPLE = 64  # calls per request recorded in the grid/block/sync histograms


def make_readers(env=os.environ, prometheus_port: Optional[int] = None, interval_ms: int = 10_000) -> list:
    readers = []
    if env.get("OTEL_EXPORTER_OTLP_METRICS_ENDPOINT") or env.get("OTEL_EXPORTER_OTLP_ENDPOINT"):
        if otlp_protocol(env) == "grpc":
            from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
        else:
            from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter
        readers.append(PeriodicExportingMetricReader(OTLPMetricExporter(), export_interval_millis=interval_ms))
    if prometheus_port:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
        start_http_server(prometheus_port, addr=env.get("OTEL_GPU_PROMETHEUS_ADDR", "0.0.0.0"))
        readers.append(PrometheusMetricReader())
    return readers


class GpuMetrics:
    def __init__(self, readers: list, resource_for: Callable[[int], Resource],
                 route_of: Callable[[str], str], kernel_name: Callable[[int, int], Optional[str]],
                 attributed: Callable[[], dict], lost_events: Callable[[], int],
                 top_kernels: int = 50) -> None:
        self.resource_for = resource_for
        self.route_of = route_of
        self.kernel_name = kernel_name
        self.top_kernels = top_kernels
        self._kernels: set[str] = set()
        self._live: dict[int, dict[int, int]] = {}  # pid -> {pointer: bytes}
        self.provider = MeterProvider(metric_readers=readers, resource=Resource.create(
            {sc.SERVICE_NAME: os.environ.get("OTEL_SERVICE_NAME", "otel-gpu")}))
        m = self.provider.get_meter("otel-gpu", __version__)
        self.launches = m.create_counter("gpu.kernel.launches", "{launch}", "Kernel launches seen on the host")
        self.copied = m.create_counter("gpu.memcpy.bytes", "By", "Bytes copied by cudaMemcpy*")
        self.grid = m.create_histogram("gpu.kernel.grid.blocks", "{block}", "Blocks per launch grid")
        self.block = m.create_histogram("gpu.kernel.block.threads", "{thread}", "Threads per block")
        self.sync = m.create_histogram("gpu.sync.duration", "s", "Duration of synchronising calls")
        self.http = m.create_histogram("http.server.request.duration", "s", "Duration of HTTP server requests")
        self.gpu_seconds = m.create_counter("otel_gpu.cost.gpu_seconds", "s", "Estimated GPU seconds by feature")
        self.cost = m.create_counter("otel_gpu.cost.amount", "1", "Estimated GPU cost by feature")
        m.create_observable_counter(
            "otel_gpu.cuda.calls", [lambda _o: [Observation(n, {sc.GPU_ATTRIBUTION: a}) for a, n in attributed().items()]],
            "{call}", "CUDA calls by attribution outcome: thread, process, ambiguous, outside")
        m.create_observable_counter("otel_gpu.events.lost", [lambda _o: [Observation(lost_events())]],
                                    "{event}", "Events lost because the ring buffer was full")
        m.create_observable_gauge("gpu.memory.allocated", [self._observe_live], "By",
                                  "Live bytes from cudaMalloc not yet freed")

    def process(self, records: list) -> list:
        for r in records:
            if isinstance(r, Request):
                self._request(r)
            elif isinstance(r, ProcessWindow):
                self._calls(r.tgid, r.sink, {sc.SERVICE_NAME: self._service(r.tgid)})
        return records

    def _service(self, pid: int) -> str:
        return str(self.resource_for(pid).attributes.get(sc.SERVICE_NAME, "unknown"))

    def _request(self, r: Request) -> None:
        route = self.route_of(r.head.path)
        base = {sc.SERVICE_NAME: self._service(r.tgid), sc.HTTP_ROUTE: route}
        http_attrs = {**base, sc.HTTP_REQUEST_METHOD: r.head.method}
        if r.status is not None:
            http_attrs[sc.HTTP_RESPONSE_STATUS_CODE] = r.status
        self.http.record(max(0, r.end_ns - r.start_ns) / 1e9, http_attrs)
        if r.gpu_seconds:
            feature = {sc.SERVICE_NAME: base[sc.SERVICE_NAME], sc.GPU_FEATURE: r.feature or route}
            self.gpu_seconds.add(r.gpu_seconds, feature)
            self.cost.add(r.cost or 0.0, feature)
        self._calls(r.tgid, r.sink, base)

    def _calls(self, pid: int, sink, base: dict) -> None:
        """Aggregated per request first: one counter add per (kernel) and (direction),
        not one per call; histograms sample the first HISTOGRAM_SAMPLE calls."""
        launches: dict[str, int] = {}
        copied: dict[str, int] = {}

        def tally(call, func, kind, count, nbytes):
            if call in KERNEL_LAUNCH_CALLS:
                name = self._bounded(pid, func)
                launches[name] = launches.get(name, 0) + count
            elif call in MEMCPY_CALLS:
                d = MEMCPY_DIRECTIONS.get(kind, "default")
                copied[d] = copied.get(d, 0) + nbytes
            elif call == CALL_MALLOC and func:
                self._live.setdefault(pid, {})[func] = nbytes
            elif call == CALL_FREE:
                self._live.get(pid, {}).pop(func, None)

        for i, (c, _attribution) in enumerate(sink.calls):
            tally(c.call, c.func, c.kind, 1, c.bytes)
            if i >= HISTOGRAM_SAMPLE:
                continue
            if c.call in KERNEL_LAUNCH_CALLS:
                self.grid.record(c.grid[0] * c.grid[1] * c.grid[2], base)
                self.block.record(c.block[0] * c.block[1] * c.block[2], base)
            elif c.call in SYNC_CALLS:
                self.sync.record(c.duration_ns / 1e9, base)
        for agg in sink.rollups.values():  # memcpy rollups keep the direction in `func`
            tally(agg.call, agg.func, agg.func if agg.call in MEMCPY_CALLS else 0, agg.count, agg.bytes)
        for name, n in launches.items():
            self.launches.add(n, {**base, sc.GPU_KERNEL_NAME: name})
        for direction, n in copied.items():
            self.copied.add(n, {**base, sc.GPU_MEMCPY_DIRECTION: direction})

    def _bounded(self, pid: int, func: int) -> str:
        name = self.kernel_name(pid, func) or "unknown"
        if name in self._kernels:
            return name
        if len(self._kernels) < self.top_kernels:
            self._kernels.add(name)
            return name
        return OTHER

    def _observe_live(self, _options):
        for pid, ptrs in list(self._live.items()):
            yield Observation(sum(ptrs.values()), {sc.SERVICE_NAME: self._service(pid), sc.PROCESS_PID: pid})

    def forget(self, pid: int) -> None:
        self._live.pop(pid, None)

    def shutdown(self) -> None:
        self.provider.shutdown()
