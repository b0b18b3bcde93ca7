"""GPU metrics through the official OTel SDK MeterProvider: OTLP when an endpoint is
configured, a Prometheus scrape endpoint as an option. Counters and gauges are the SDK's;
histograms are aggregated in export/histograms.py (the SDK's per-value path cost ~20 µs
a value, several per request) and go out through the same readers. A pipeline stage: it
reads finished, enriched requests and process windows, and passes every record on.

The metrics that name an API are per vendor: OBI's gpu.cuda.* for CUDA calls, and the
same names under gpu.hip.* for HIP calls (ApiMetrics; docs/spans-and-metrics.md says
why); the rest (sync, memory, NCCL/RCCL, HTTP, cost) are the same for both.

Kernel names are bounded: the first `top_kernels` distinct names keep their own
series, later ones are reported as "other"; a CUDA graph launch counts each kernel it
ran (its capture's counts) by name. Grid/block/sync histograms sample the
first HISTOGRAM_SAMPLE calls of each request; counters include every call."""
from __future__ import annotations

import logging
import time
from typing import Optional

from opentelemetry.metrics import Observation
from opentelemetry.sdk.metrics import MeterProvider
from opentelemetry.sdk.metrics.export import PeriodicExportingMetricReader
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.util.instrumentation import InstrumentationScope

from .. import __version__
from .. import semconv as sc
from ..cuda_calls import API_CUDA, API_HIP, BY_ID, Category, MEMCPY_DIRECTIONS
from ..probes.rows import CUDA_PROBES, NCCL_STATE_PROBES, PYTHON_PROBES
from ..pipeline.model import ATTRIBUTIONS, ProcessWindow, Request
from ..pipeline.time_split import PARTS
from ..probes import nccl
from ..probes.attacher import ProbeCounts
from ..probes.summary_buckets import HTTP_DURATION_BOUNDS_S
from ..ratelimit import Stats, split_drops
from ..records import ProcessGone, RequestSummary
from .bounded import call_by, remaining_ms
from .cost_metrics import CostMetrics
from .histograms import Histograms
from .metric_labels import OTHER, ServiceNames, device_labels
from .metric_values import INT64_MAX, BatchedAdds, BatchedRecords, CappedCounter, GuardedExporter, clamp_call_bytes

log = logging.getLogger(__name__)
# Calls per request recorded in the grid/block/sync histograms. At 64, through the SDK's
# histograms (5-20 µs a value), a request streaming its whole budget of launches cost
# ~0.8 ms of collector CPU in these two alone; export/histograms.py takes ~2 µs a value.
HISTOGRAM_SAMPLE = 8
_LAUNCH_API = {c.id: c.api for c in BY_ID.values() if c.category is Category.LAUNCH}  # call id -> its API
PROBE_FUNCTION = "otel_gpu.probe.function"  # label of the probe gauges: a symbol of the probe table
PROBE_SYMBOLS = frozenset(r.symbol for r in CUDA_PROBES + PYTHON_PROBES + NCCL_STATE_PROBES)  # bounds its values


def make_readers(config, stats: Optional[Stats] = None) -> list:
    """The metric readers the configuration asks for (none: metrics are off). Prometheus
    binds config.prometheus_addr: 127.0.0.1 unless told otherwise."""
    readers = []
    if config.otlp_metrics:
        from .metric_exporter import otlp_metric_exporter
        stats = stats or Stats()
        exporter = GuardedExporter(otlp_metric_exporter(config.otlp_protocol, stats), stats)
        readers.append(PeriodicExportingMetricReader(exporter, export_interval_millis=config.metric_interval_ms))
    if config.prometheus_port:
        from opentelemetry.exporter.prometheus import PrometheusMetricReader
        from prometheus_client import start_http_server
        start_http_server(config.prometheus_port, addr=config.prometheus_addr)
        readers.append(PrometheusMetricReader())
    return readers


class ApiMetrics:
    """The instruments whose name says the API (OBI's gpu.cuda.*, and gpu.hip.* beside them)."""

    def __init__(self, api: str, m, histograms: Histograms, stats: Stats) -> None:
        runtime = {API_CUDA: "CUDA", API_HIP: "HIP"}[api]
        copy_call, alloc_call = f"{api}Memcpy*", f"{api}Malloc*"
        self.launches = CappedCounter(m.create_counter(
            f"gpu.{api}.kernel.launch.calls", "{call}", f"{runtime} kernel launch calls, by kernel"), stats)
        self.graph_launches = CappedCounter(m.create_counter(
            f"gpu.{api}.graph.launch.calls", "{call}", f"{runtime} graph launches"), stats)
        # Calls counted in the kernel past the span budget are recorded at their mean size:
        # count and sum exact, the distribution of those approximate.
        self.copies = histograms.create(f"gpu.{api}.memory.copies", "By", f"Bytes per {copy_call} call, by kind")
        self.allocations = CappedCounter(m.create_counter(
            f"gpu.{api}.memory.allocations", "By", f"Bytes allocated by {alloc_call} calls that succeeded"), stats)
        self.grid = histograms.create(f"gpu.{api}.kernel.grid.size", "1", "Blocks per launch grid")
        self.block = histograms.create(f"gpu.{api}.kernel.block.size", "1", "Threads per block")
        self.memcpy_kind = sc.MEMCPY_KIND_LABELS[api]


# cuda.memcpy.kind values, as OBI names the cudaMemcpyKind directions.
MEMCPY_KINDS = {"h2h": "HostToHost", "h2d": "HostToDevice", "d2h": "DeviceToHost", "d2d": "DeviceToDevice",
                "default": "Default"}


class GpuMetrics:
    def __init__(self, readers: list, stats: Optional[Stats] = None, top_kernels: int = 50,
                 service_name: str = "otel-gpu") -> None:
        self.stats = stats or Stats()
        self.top_kernels = top_kernels
        self._kernels: set[str] = set()
        self._live: dict[int, dict[int, int]] = {}  # pid -> {pointer: bytes}
        self._services: dict[int, str] = {}          # pid -> service.name, while it has live memory
        self.services = ServiceNames(self.stats)    # label values so far: MAX_SERVICES, then OTHER
        self._attributed = dict.fromkeys(ATTRIBUTIONS, 0)
        self._probes = ProbeCounts({}, {})  # the latest, from the collector at each flush
        self._probe_symbols: set[str] = set()  # every one seen: a failure that heals reports 0
        self._adds = BatchedAdds()
        self._records = BatchedRecords()
        self.provider = MeterProvider(metric_readers=readers, resource=Resource.create(
            {sc.SERVICE_NAME: service_name}))
        scope = InstrumentationScope("otel-gpu", __version__)
        m = self.provider.get_meter(scope.name, scope.version)
        # Histograms record several values per request: ours, exported through the same readers.
        histograms = Histograms(scope)
        for reader in readers:
            histograms.attach(reader)
        # Where a metric means what one of the OpenTelemetry eBPF Instrumentation (OBI) means, it
        # has OBI's name and attributes, so a dashboard built for OBI works on these
        # (docs/spans-and-metrics.md has the mapping); our extra labels ride along.
        self.apis = {api: ApiMetrics(api, m, histograms, self.stats) for api in (API_CUDA, API_HIP)}
        self.graph_kernels = CappedCounter(m.create_counter(
            "otel_gpu.graph.kernel.launches", "{launch}", "Kernels run by graph launches, by kernel"),
            self.stats)
        # By op: a fixed set of 7 values (probes/nccl.py), whatever a process passes.
        self.nccl_calls = CappedCounter(m.create_counter("gpu.nccl.calls", "{call}",
                                                         "NCCL collectives and send/recv, by op"), self.stats)
        self.nccl_bytes = CappedCounter(m.create_counter("gpu.nccl.bytes", "By",
                                                         "Bytes received by NCCL calls (send: sent), by op"),
                                        self.stats)
        self.sync = histograms.create("gpu.sync.duration", "s", "Duration of synchronising calls")
        # The semantic conventions' boundaries (the SDK's default ones start at 0, 5, 10 s:
        # every request in one bucket, a p95 of ~4.75 s whatever the latency).
        self.http = histograms.create("http.server.request.duration", "s", "Duration of HTTP server requests",
                                      HTTP_DURATION_BOUNDS_S)
        self.time_parts = histograms.create(
            "otel_gpu.request.time", "s", "Where each request's time went, by otel_gpu.time.part (on_cpu, cpu_wait, "
            "gpu_sync, blocked) and otel_gpu.time.shared (pipeline/time_split.py)", HTTP_DURATION_BOUNDS_S)
        self.gpu_seconds = m.create_counter("otel_gpu.cost.gpu_seconds", "s", "Estimated GPU seconds by feature")
        self.cost = m.create_counter("otel_gpu.cost.amount", "1", "Estimated GPU cost by feature")
        # Cost per streamed token, by feature: otel_gpu.cost.gpu_seconds (or .amount) over this,
        # each summed over services (a batching engine's shares count under the engine's).
        self.chunks = m.create_counter("otel_gpu.response.chunks", "{chunk}",
                                       "Response chunks written (a streamed token each, for SSE), by feature")
        m.create_observable_counter(
            "otel_gpu.cuda.calls",
            [lambda _o: [Observation(n, {sc.GPU_ATTRIBUTION: a}) for a, n in dict(self._attributed).items()]],
            "{call}", "CUDA calls by attribution outcome: task, thread, process, ambiguous, shared, outside")
        m.create_observable_counter(
            "otel_gpu.events.lost", [lambda _o: [Observation(self.stats.snapshot().get("lost_events", 0))]],
            "{event}", "Events lost because the ring buffer was full")
        m.create_observable_counter(
            "otel_gpu.drops", [self._observe_drops], "1",
            "What the collector dropped, folded or clamped, by reason: the counters of its stopped: line")
        m.create_observable_gauge("gpu.memory.allocated", [self._observe_live], "By",
                                  "Live bytes from cudaMalloc / hipMalloc not yet freed")
        m.create_observable_gauge(
            "otel_gpu.probes.attached", [lambda _o: self._observe_probes(self._probes.attached)], "{file}",
            "Files (or file and process pairs) each probed function is attached to")
        m.create_observable_gauge(
            "otel_gpu.probes.failed", [lambda _o: self._observe_probes(self._probes.failed)], "{file}",
            "Files (or file and process pairs) where a function's probe failed to attach and is not "
            "attached now (retried with backoff)")

    def process(self, records: list) -> list:
        """Before the cost stage: requests and calls count as they finish, whatever their
        cost awaits. Cost counts in costs()."""
        for r in records:
            if isinstance(r, Request):
                self._request(r)
            elif isinstance(r, ProcessWindow):
                self._calls(r, ((sc.SERVICE_NAME, self.services.of(r)),))
            elif isinstance(r, RequestSummary):
                self._summarised(r)
            elif isinstance(r, ProcessGone):
                self._live.pop(r.tgid, None)
                self._services.pop(r.tgid, None)
            elif isinstance(r, ProbeCounts):
                self._probes = r
                # rebound, not updated: the readers' thread iterates it
                self._probe_symbols = self._probe_symbols | ((r.attached.keys() | r.failed.keys()) & PROBE_SYMBOLS)
        self._adds.flush()
        self._records.flush()
        return records

    def _request(self, r: Request) -> None:
        base = ((sc.SERVICE_NAME, self.services.of(r)), (sc.HTTP_ROUTE, r.route or r.head.path))
        if not r.records_lost:  # partial: the kernel's summary counts it
            http_attrs = base + ((sc.HTTP_REQUEST_METHOD, r.head.method),)
            if r.status is not None:
                http_attrs += ((sc.HTTP_RESPONSE_STATUS_CODE, r.status),)
            self._records.record(self.http, max(0, r.end_ns - r.start_ns) / 1e9, http_attrs)
        if r.time_split is not None:
            shared = "true" if r.time_shared else "false"  # one spelling in every exporter (Prometheus: "True")
            for part, ns in zip(PARTS, r.time_split):
                self._records.record(self.time_parts, ns / 1e9,
                                     base + ((sc.GPU_TIME_PART, part), (sc.GPU_TIME_SHARED, shared)))
        # The physical GPU where certain: bounded by the GPUs the driver lists (read once at start).
        self._calls(r, base + device_labels(r))

    def _summarised(self, r: RequestSummary) -> None:
        """Each request at its kernel bucket's mean: in the histogram bucket its own
        duration falls in (the same boundaries: probes/summary_buckets.py), the sum exact."""
        attrs = ((sc.SERVICE_NAME, self.services.of(r)), (sc.GPU_REQUEST_SUMMARISED, True))
        for count, sum_ns in r.buckets:
            for _ in range(count):
                self._records.record(self.http, sum_ns / count / 1e9, attrs)

    def costs(self) -> "CostMetrics":
        """The stage after the cost stage that counts cost on these instruments."""
        return CostMetrics(self.gpu_seconds, self.cost, self.chunks, self.services)

    def _calls(self, record, base: tuple) -> None:
        """Aggregated per request first: one counter add per (kernel) and (direction),
        not one per call; histograms sample the first HISTOGRAM_SAMPLE calls. `base`: the
        labels, as (key, value) pairs (BatchedAdds)."""
        pid, sink, names = record.tgid, record.sink, record.kernel_names
        for attribution, n in sink.attributed.items():
            self._attributed[attribution] += n
        launches: dict[str, dict[str, int]] = {}  # api -> kernel -> launches
        graph_kernels: dict[str, int] = {}
        graphs: dict[str, int] = {}     # api -> graph launches
        allocated: dict[str, int] = {}  # api -> bytes
        copies: list[tuple[str, str, float, int]] = []  # (api, kind, bytes per call, calls)
        collectives: dict[str, list] = {}  # op -> [calls, bytes]

        def tally(call, detail, count, nbytes, ok=True, kernels=None):
            spec = BY_ID.get(call)
            category, api = (spec.category, spec.api) if spec else (None, API_CUDA)
            if category is Category.LAUNCH:
                by_kernel = launches.setdefault(api, {})
                name = self._bounded(names.get(detail))
                by_kernel[name] = by_kernel.get(name, 0) + count
            elif category is Category.GRAPH:
                graphs[api] = graphs.get(api, 0) + count
                for func, n in kernels or ():  # what the graph ran (pipeline/graphs.py)
                    name = self._bounded(names.get(func))
                    graph_kernels[name] = graph_kernels.get(name, 0) + n * count
            elif category is Category.MEMCPY:
                kind = MEMCPY_KINDS[MEMCPY_DIRECTIONS.get(detail, "default")]
                copies.append((api, kind, clamp_call_bytes(nbytes, self.stats, count) / max(count, 1), count))
            elif category is Category.ALLOC and detail and ok:
                self._live.setdefault(pid, {})[detail] = nbytes
                self._services[pid] = dict(base)[sc.SERVICE_NAME]
                allocated[api] = allocated.get(api, 0) + nbytes
            elif category is Category.FREE:
                self._live.get(pid, {}).pop(detail, None)
            elif category is Category.COLLECTIVE:
                op = collectives.setdefault(nccl.op_name(call), [0, 0])
                op[0] += count
                op[1] += clamp_call_bytes(nbytes, self.stats, count)
            return category, api

        for i, (c, _attribution) in enumerate(sink.calls):
            detail, nbytes, duration_ns = c.amounts()
            # a failed cudaMalloc allocated nothing; an unreadable *devPtr names nothing
            category, api = tally(c.call, detail, 1, nbytes, ok=c.ret <= 0 and not c.unreadable,
                                  kernels=getattr(c, "kernels", None))
            if i >= HISTOGRAM_SAMPLE:
                continue
            if category is Category.LAUNCH and not c.unreadable:  # its dims are unknown, not 0
                self._records.record(self.apis[api].grid, c.grid[0] * c.grid[1] * c.grid[2], base)
                self._records.record(self.apis[api].block, c.block[0] * c.block[1] * c.block[2], base)
            elif category is Category.SYNC:
                self._records.record(self.sync, duration_ns / 1e9, base)
        bounded, known = self._bounded, self._kernels
        for agg in sink.rollups.values():
            api = _LAUNCH_API.get(agg.call)
            if api is None:
                tally(agg.call, agg.detail, agg.count, agg.bytes, kernels=agg.kernels)
                continue
            # A launch rollup, a kernel each (a request may count dozens): tally's first branch, inline.
            name = names.get(agg.detail) or "unknown"
            if name not in known:
                name = bounded(name)
            by_kernel = launches.get(api)
            if by_kernel is None:
                by_kernel = launches[api] = {}
            by_kernel[name] = by_kernel.get(name, 0) + agg.count
        for api, by_kernel in launches.items():
            self._adds.add_each(self.apis[api].launches, base, sc.GPU_KERNEL_NAME, by_kernel)
        for name, n in graph_kernels.items():
            self._adds.add(self.graph_kernels, n, base + ((sc.GPU_KERNEL_NAME, name),))
        for api, n in graphs.items():
            self._adds.add(self.apis[api].graph_launches, n, base)
        for api, n in allocated.items():
            if n:
                self._adds.add(self.apis[api].allocations, n, base)
        for api, kind, size, n in copies:
            instruments = self.apis[api]
            labels = base + ((instruments.memcpy_kind, kind),)
            for _ in range(n):  # each call is a value
                self._records.record(instruments.copies, size, labels)
        for op, (n, nbytes) in collectives.items():
            labels = base + ((sc.GPU_NCCL_OP, op),)
            self._adds.add(self.nccl_calls, n, labels)
            self._adds.add(self.nccl_bytes, nbytes, labels)

    def _bounded(self, name: Optional[str]) -> str:
        name = name or "unknown"
        if name in self._kernels:
            return name
        if len(self._kernels) < self.top_kernels:
            self._kernels.add(name)
            return name
        return OTHER

    def _observe_drops(self, _options):
        for reason, n in split_drops(self.stats.snapshot())[0].items():
            yield Observation(n, {"otel_gpu.reason": reason})

    def _observe_probes(self, counts: dict):
        for symbol in sorted(self._probe_symbols):
            yield Observation(counts.get(symbol, 0), {PROBE_FUNCTION: symbol})

    def _observe_live(self, _options):
        for pid, ptrs in list(self._live.items()):
            yield Observation(min(sum(ptrs.values()), INT64_MAX), {sc.SERVICE_NAME: self._services.get(pid, "unknown"),
                                                   sc.PROCESS_PID: pid})

    def close(self, deadline: Optional[float] = None) -> None:
        """The readers' final export, until `deadline` (time.monotonic(); default 5 s from
        now) whatever the backend does; one still running then is counted by its exporter."""
        deadline = time.monotonic() + 5 if deadline is None else deadline
        # The provider's own timeout ends a little earlier, so that its exporter counts an
        # abandoned export before this call gives up on it (never both).
        provider_ms = lambda: max(0.0, remaining_ms(deadline) - 250)  # noqa: E731
        if not call_by(deadline, lambda: self.provider.shutdown(timeout_millis=provider_ms()), "metrics shutdown"):
            self.stats.add("metrics_dropped_shutdown", 1)
            log.warning("metrics: shutdown not finished by its deadline; the final export is abandoned")

    def shutdown(self) -> None:
        self.close()
