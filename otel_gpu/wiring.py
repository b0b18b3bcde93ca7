"""The pipeline's stages, wired from configuration in the order a record passes them:

    probes (BpfProgram) -> graphs -> /proc facts -> device times -> stitcher -> device wait
        -> enrich -> cost -> export -> metrics

(metrics also count requests as they finish, before the cost stage: two stages of one
GpuMetrics); the export stage's destinations (console, the local store, OTLP) are built
here too, since export/ and store/ do not import each other. Records are the only channel between stages: no stage calls another, and
nothing re-enters the middle of the pipeline. The Collector (collector.py) owns the
program and pushes its records through."""
from __future__ import annotations

import logging
import sys
from dataclasses import dataclass
from functools import partial
from typing import Optional, TextIO

from .clock import BpfClock
from .config import Config
from .enrich.resources import ProcessResources
from .enrich.routes import RouteTemplater
from .enrich.stage import Enrich
from .enrich.code_symbols import CodeSymbols
from .enrich.symbols import KernelNames
from .export.console import ConsoleTreeExporter
from .export.destinations import Destinations, QueuedExporter, otlp_span_exporter
from .export.spans import SpanBuilder
from .export.stage import ExportStage
from .gpu_devices import DeviceIdentities, gpu_model
from .pipeline.cost import CostStage, Prices
from .pipeline.device_times import DeviceTimes, DeviceWait
from .pipeline.graphs import Graphs
from .pipeline.groups import ProcessGroups
from .pipeline.proc_facts import ProcFacts
from .pipeline.sampling import SamplingPlan, plan as sampling_plan
from .pipeline.stitcher import Stitcher
from .ratelimit import Stats
from .own_sockets import OwnSockets
from .sockets import PortCache, open_sockets
from .store.exporter import StoreExporter
from .store.schema import StoreError
from .value_cap import ValueCap

log = logging.getLogger(__name__)


def build_destinations(config: Config, stats: Stats, out: TextIO = sys.stdout) -> Destinations:
    """console, store, otlp: each when configured, in that order. A store that cannot be
    written (full disk, read-only, permission, a newer schema) is one error line and left
    out (store_disabled), the others unaffected; when it is the only destination, the
    StoreError is raised (`otel-gpu run` exits 2). An unknown protocol: ValueError."""
    # Made first: a bad protocol fails before the store file is created.
    otlp = otlp_span_exporter(config.otlp_protocol) if config.otlp_traces else None
    exporters = []
    if config.console:
        exporters.append(("console", ConsoleTreeExporter(out)))
    if config.store_path:
        try:
            exporters.append(("store", StoreExporter(config.store_path, stats=stats, group=config.store_group)))
        except StoreError as e:
            others = [name for name, _ in exporters] + (["otlp"] if otlp is not None else [])
            if not others:
                raise
            stats.add("store_disabled")
            log.error("%s; running on without it: spans still go to %s", e, " and ".join(others))
    if otlp is not None:  # the batch worker thread starts only once nothing else can fail
        exporters.append(("otlp", QueuedExporter(otlp, stats, config.queue_size, config.export_batch_size,
                                                 config.schedule_delay_ms)))
    return Destinations(exporters, stats)


class Pipeline:
    """Stages with one shape: process(batch) -> batch, run in order."""

    def __init__(self, stages: list) -> None:
        self.stages = stages

    def push(self, batch: list) -> list:
        for stage in self.stages:
            if not batch:
                break
            batch = stage.process(batch)
        return batch

    def state(self) -> dict:
        out: dict = {}
        for stage in self.stages:
            if hasattr(stage, "state"):
                out.update(stage.state())
        return out

    def start_close(self, deadline: float) -> list:
        """The stages that hold something (spans, metrics) start closing side by side,
        each flushing to its own backend by `deadline` (time.monotonic()). Returns one
        event per stage, set when it is closed (export.bounded.wait_by)."""
        from .export.bounded import start
        return [start(partial(stage.close, deadline), f"{type(stage).__name__} close")
                for stage in self.stages if hasattr(stage, "close")]


@dataclass
class Wiring:
    pipeline: Pipeline
    stitcher: Stitcher       # kept for the final counters only
    destinations: object     # export.destinations.Destinations
    ports: PortCache
    groups: ProcessGroups    # related processes, for the stitcher and discovery
    sampling: SamplingPlan   # the collector's kernel settings follow it too


def build_pipeline(config: Config, stats: Stats, k8s=None, destinations=None,
                   metric_readers: Optional[list] = None, kernel_names=None, clock=None) -> Wiring:
    """The stages, from configuration. Metrics are left out when no reader is asked for.
    Tests pass their own destinations, readers and kernel namer."""
    ports = PortCache(config.proc_root)
    groups = ProcessGroups(config.proc_root)
    kept_headers = config.export_headers | ({config.feature_header} if config.feature_header else set())
    sampling = sampling_plan(config.traces_sampler, config.traces_sampler_arg)
    facts = ProcFacts(ports.port, ports.peer, groups, lambda pid: open_sockets(config.proc_root, pid),
                      OwnSockets())
    stitcher = Stitcher(config.span_budget, frozenset(kept_headers), stats, sampler=sampling.sampler,
                        quiet_when_idle=sampling.quiet_when_idle, kernel_bound=sampling.kernel_bound,
                        root_bound=sampling.root_bound)
    enrich = Enrich(ProcessResources(config.proc_root, k8s, config.resource_attributes, stats,
                                     config.export_command_line),
                    RouteTemplater(config.route_patterns, max_routes=config.max_routes, stats=stats),
                    kernel_names or KernelNames(symbols=CodeSymbols(config.proc_root)),
                    DeviceIdentities(stats, config.proc_root, config.nvidia_procfs, config.amd_sysfs))
    prices = Prices(config.gpu_price, config.currency, gpu_model(config.nvidia_procfs, config.amd_sysfs))
    cost = CostStage(prices, config.feature_header,
                     feature_cap=ValueCap(config.max_routes, stats, "features_folded"))
    destinations = destinations if destinations is not None else build_destinations(config, stats)
    builder = SpanBuilder(clock or BpfClock(), config.export_query, config.export_headers,
                          currency=config.currency, sampler=sampling.sampler, stats=stats, max_links=config.max_links)
    if metric_readers is None:
        from .export.metrics import make_readers
        metric_readers = make_readers(config, stats)
    # Metrics count requests as they finish (before the cost stage holds them), cost once priced.
    metrics = None
    if metric_readers:
        from .export.metrics import GpuMetrics
        metrics = GpuMetrics(metric_readers, stats, service_name=config.self_service_name)
    device_times = DeviceTimes(stats)  # device-clock mode: ties device records to their calls
    stages = [Graphs(), facts, device_times, stitcher, DeviceWait(stats), enrich,
              *([metrics] if metrics else []), cost,
              *([metrics.costs()] if metrics else []), ExportStage(builder, destinations)]
    return Wiring(Pipeline(stages), stitcher, destinations, ports, groups, sampling)
