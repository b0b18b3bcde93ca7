"""The running collector: probes -> reader -> stitcher -> enrich -> export, wired here."""
from __future__ import annotations

import ctypes as ct
import logging
import threading
import time
from pathlib import Path
from typing import Optional

from .clock import BpfClock
from .config import Config
from .export.sink import SpanSink
from .export.spans import SpanBuilder
from .pipeline.cost import CostStage, Prices
from .pipeline.enrich import ProcessCatalog
from .pipeline.model import ProcessGone, ProcessSeen, ProcessWindow, Request
from .pipeline.routes import RouteTemplater
from .pipeline.sockets import PortCache
from .pipeline.stitcher import Stitcher
from .pipeline.symbols import KernelNames
from .probes.attacher import Attacher
from .probes.discovery import Discovery
from .probes.program import ProgramOptions, load

log = logging.getLogger("otel_gpu")


class ExportStage:
    """Builds spans for finished requests and windows and hands them to the sink."""

    def __init__(self, builder: SpanBuilder, sink: SpanSink) -> None:
        self.builder = builder
        self.sink = sink

    def process(self, records: list) -> list:
        for r in records:
            if isinstance(r, (Request, ProcessWindow)):
                self.sink.emit(self.builder.build(r))
        return records


class Pipeline:
    """Stages with one shape: process(batch) -> batch. Optional stages are left out."""

    def __init__(self, stages: list) -> None:
        self.stages = stages

    def push(self, batch: list, after=None) -> list:
        """Runs `batch` through the stages, or through those after stage `after`
        (records a stage releases on its own, e.g. on a timer, start past it)."""
        stages = self.stages[self.stages.index(after) + 1:] if after is not None else self.stages
        for stage in stages:
            if not batch:
                break
            batch = stage.process(batch)
        return batch


class Collector:
    def __init__(self, config: Config, sink: SpanSink, k8s=None, extra_stages: Optional[list] = None,
                 resource_attributes: Optional[dict] = None) -> None:
        self.config = config
        self.stats = sink.stats  # one set of counters for the whole collector
        self.clock = BpfClock()
        self.sink = sink
        self.ports = PortCache(config.proc_root)
        self.kernel_names = KernelNames()
        kept_headers = config.export_headers | ({config.feature_header} if config.feature_header else set())
        self.stitcher = Stitcher(config.span_budget, frozenset(kept_headers), self.stats, port_of=self.ports.port)
        routes = RouteTemplater(config.route_patterns)
        self.cost = CostStage(Prices(config.gpu_price, config.currency), self._open_requests,
                              config.feature_header, routes.route)
        self.catalog = ProcessCatalog(config.proc_root, k8s, resource_attributes or {}, self.stats)
        builder = SpanBuilder(self.clock, routes, self.catalog.resource, self.kernel_names,
                              config.export_query, config.export_headers, currency=config.currency)
        self.metrics = self._metrics(routes)
        self.pipeline = Pipeline([self.stitcher, self.cost, self.catalog, ExportStage(builder, sink),
                                  *([self.metrics] if self.metrics else []), *(extra_stages or []), self])
        self.discovery = Discovery(config.proc_root, None if config.trace_all else self._wanted)
        self.bpf = None
        self._exited: list[int] = []
        self._traced_pids: set[int] = set()
        self.state_requested = threading.Event()
        self._rollups_read_ns: Optional[int] = None

    # Last stage: bookkeeping for processes that are gone.
    def process(self, records: list) -> list:
        for r in records:
            if isinstance(r, ProcessGone):
                self._exited.append(r.tgid)
            elif isinstance(r, ProcessSeen) and r.tgid in self._exited:
                self._exited.remove(r.tgid)  # the pid was reused before the flush: keep its state
        return records

    def _metrics(self, routes):
        """The metrics stage, when OTLP or Prometheus is configured (else left out)."""
        from .export.metrics import GpuMetrics, make_readers
        readers = make_readers(prometheus_port=self.config.prometheus_port)
        if not readers:
            return None
        return GpuMetrics(readers, self.catalog.resource, routes.route, self.kernel_names,
                          attributed=lambda: dict(self.stitcher.attributed),
                          lost_events=lambda: self.stats.snapshot().get("lost_events", 0))

    def _open_requests(self, tgid: int) -> list:
        p = self.stitcher.procs.get(tgid)
        return p.open if p else []

    def _wanted(self, pid: int) -> bool:
        if pid in self.config.pids:
            return True
        if self.config.exes:
            try:
                comm = Path(f"{self.config.proc_root}/{pid}/comm").read_text().strip()
                exe = Path(f"{self.config.proc_root}/{pid}/exe").resolve().name
            except OSError:
                return False
            return comm in self.config.exes or exe in self.config.exes
        return False

    def start(self) -> None:
        t0 = time.monotonic()
        self.bpf = load(ProgramOptions(trace_all=self.config.trace_all, ringbuf_pages=self.config.ringbuf_pages))
        from .pipeline.reader import RingReader, RollupReader
        self.reader = RingReader(self.bpf, self.stats)
        self.rollups = RollupReader(self.bpf)
        self.attacher = Attacher(self.bpf)
        self._scan()
        self.clock.resync()
        log.info("ready: %d tracepoints, %d CUDA probes on %d files, %d processes traced (%.1f s)",
                 self.bpf.num_open_tracepoints(), self.attacher.probe_count,
                 len(self.attacher.attached), len(self.bpf["traced"]), time.monotonic() - t0)
        if self.config.health_file:
            Path(self.config.health_file).write_text("ready\n")

    def _scan(self) -> None:
        found = self.discovery.scan()
        for target in found.targets:
            self.attacher.attach(target)
        traced = self.bpf["traced"]
        for pid in found.cuda_pids - self._traced_pids:
            traced[ct.c_uint32(pid)] = ct.c_uint32(1)
            self.catalog.resource(pid)  # read /proc now, while the process is surely alive
            log.info("tracing pid %d", pid)
        self._traced_pids = found.cuda_pids

    def run(self, stop: threading.Event) -> None:
        next_scan = next_flush = time.monotonic()
        while not stop.is_set():
            self.pipeline.push(self.reader.poll(100))
            now = time.monotonic()
            if now >= next_scan:
                self._scan()
                next_scan = now + self.config.scan_interval_s
            if now >= next_flush:
                self.flush()
                next_flush = now + self.config.flush_interval_s
            if self.state_requested.is_set():
                self.state_requested.clear()
                self.pipeline.push(self.reader.poll(0))  # as of the signal: drain first
                log.info("%s", self.state())

    def flush(self) -> None:
        """Per interval: in-kernel rollups, ambiguous/outside windows, exited processes."""
        self._read_kernel_rollups()
        self.pipeline.push(self.stitcher.flush_windows(), after=self.stitcher)
        self.pipeline.push(self.cost.poll(), after=self.cost)
        self._forget_exited()
        lost, seen = self.reader.counters()["ringbuf_full"], self.stats.snapshot().get("lost_events", 0)
        if lost > seen:
            log.warning("ring buffer full: %d events lost so far", lost)
            self.stats.add("lost_events", lost - seen)

    def _read_kernel_rollups(self) -> None:
        now = time.monotonic_ns()
        self.stitcher.add_kernel_rollups(self.rollups.deltas(), now, self._rollups_read_ns)
        self._rollups_read_ns = now

    def _forget_exited(self) -> None:
        """Drops every trace of processes that exited: Python state and BPF map entries."""
        if not self._exited:
            return
        gone = set(self._exited)
        self._exited.clear()
        for tgid in gone:
            self.stitcher.procs.pop(tgid, None)  # recreated by its last in-kernel rollups
            self.catalog.forget(tgid)
            self.rollups.forget(tgid)
            self.kernel_names.forget(tgid)
            self.ports.forget(tgid)
            if self.metrics:
                self.metrics.forget(tgid)
            for name in ("traced", "http_active"):
                try:
                    del self.bpf[name][ct.c_uint32(tgid)]
                except KeyError:
                    pass
        # One pass per table whatever the number of exits: reading a map key by key is slow.
        for name, tgid_of in (("conns", lambda k: k.tgid), ("in_call", lambda k: k.value >> 32),
                              ("reading", lambda k: k.value >> 32), ("writing", lambda k: k.value >> 32),
                              ("accepting", lambda k: k.value >> 32)):
            table = self.bpf[name]
            for k in [k for k in table.keys() if tgid_of(k) in gone]:
                try:
                    del table[k]
                except KeyError:
                    pass

    def shutdown(self) -> None:
        """Drain what is left, close open requests, flush exporters, detach probes."""
        try:
            if self.bpf is not None:
                self.pipeline.push(self.reader.poll(0))
                self._read_kernel_rollups()
                self.pipeline.push(self.stitcher.close_all(time.monotonic_ns(), "collector stopped"),
                                   after=self.stitcher)
                self.pipeline.push(self.cost.flush(), after=self.cost)
        finally:
            self.sink.shutdown()
            if self.metrics:
                self.metrics.shutdown()
            if self.bpf is not None:
                self.attacher.detach_all()
                self.bpf = None
            if self.config.health_file:
                Path(self.config.health_file).unlink(missing_ok=True)
        log.info("stopped: %s", self.summary())

    def state(self) -> str:
        """Sizes of every table that must return to baseline when processes go away."""
        bpf = {name: len(self.bpf[name]) for name in ("traced", "http_active", "conns", "rollup", "in_call")} \
            if self.bpf is not None else {}
        procs = self.stitcher.procs
        return ("state: " + " ".join(f"bpf.{k}={v}" for k, v in bpf.items()) +
                f" procs={len(procs)} conns={sum(len(p.conns) for p in procs.values())}"
                f" open_requests={sum(len(p.open) for p in procs.values())}"
                f" held_for_cost={len(self.cost._held)} resources={len(self.catalog._resources)}")

    def summary(self) -> str:
        s = self.stats.snapshot()
        a = self.stitcher.attributed
        return (f"{s.get('requests_finished', 0)} requests, {self.sink.spans_out} spans; CUDA calls by "
                f"attribution: thread={a['thread']} process={a['process']} ambiguous={a['ambiguous']} "
                f"outside={a['outside']}; dropped: {', '.join(f'{k}={v}' for k, v in sorted(s.items()) if k not in ('requests_finished',)) or 'none'}")
