"""The pipeline as otel_gpu/wiring.py wires it, fed synthetic ring-buffer records:
every record passes each stage once, in order; stages know nothing of each other; a
request, a window and a process's exit come out as spans and metrics."""
import random

import pytest

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_gpu import semconv as sc
from otel_gpu.clock import BpfClock
from otel_gpu.wiring import build_pipeline
from otel_gpu.config import Config
from otel_gpu.export.destinations import Destinations
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, Accept, KernelRollup, ProcExit, SockIo, Tick
from otel_gpu.cuda_calls import call_id
from otel_gpu.ratelimit import Stats
from tests.unit.pipeline.calls import cuda
from tests.unit.enrich.test_resources import fake_proc

PID = 4321
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Names:
    def __call__(self, pid, func):
        return f"k{func:x}"

    def forget(self, pid):
        pass


def wired(tmp_path, **config):
    fake_proc(tmp_path, PID, env={"OTEL_SERVICE_NAME": "svc"})
    spans = InMemorySpanExporter()
    reader = InMemoryMetricReader()
    stats = Stats()
    w = build_pipeline(Config(proc_root=str(tmp_path), **config), stats,
                       destinations=Destinations([("memory", spans)], stats),
                       metric_readers=[reader], kernel_names=Names(), clock=BpfClock())
    w.stitcher._rng = random.Random(1)
    return w, spans, reader


def request_events(ts=1000, fd=7, tid=1, path="/infer/3", launches=3):
    head = f"GET {path} HTTP/1.1\r\n\r\n".encode()
    evs = [Accept(PID, tid, ts, fd, 3, "127.0.0.1", 5000),
           SockIo(EV_SOCK_READ, PID, tid, ts + 1, fd, len(head), head, b"")]
    evs += [cuda(func=0x10 + i, pid=PID, tid=tid, ts=ts + 2 + i) for i in range(launches)]
    evs += [cuda("cudaMemcpy", nbytes=64, kind=2, pid=PID, tid=tid, ts=ts + 10),
            SockIo(EV_SOCK_WRITE, PID, tid, ts + 20, fd, len(OK), OK, OK[-8:])]
    return evs


class Recorder:
    """Wraps a stage; logs (stage index, record identity) for every record it is given."""

    def __init__(self, index, stage, log):
        self.index, self.stage, self.log = index, stage, log

    def process(self, batch):
        self.log += [(self.index, id(r)) for r in batch]
        return self.stage.process(batch)


def test_a_request_passes_every_stage_once_in_order(tmp_path):
    w, spans, _ = wired(tmp_path)
    log: list = []
    stages = w.pipeline.stages
    w.pipeline.stages = [Recorder(i, s, log) for i, s in enumerate(stages)]
    events = request_events()
    w.pipeline.push(events)
    # Ring-buffer records reach the graph stage, the /proc facts stage, the device-times stage
    # and the stitcher only; what the stitcher makes (the request, ProcessSeen, RequestOpened)
    # reaches each later stage exactly once, in stage order.
    assert ({id(e) for e in events} == {rid for i, rid in log if i == 0} <= {rid for i, rid in log if i == 1}
            <= {rid for i, rid in log if i == 2} <= {rid for i, rid in log if i == 3})
    assert not {id(e) for e in events} & {rid for i, rid in log if i > 3}
    made = {rid for i, rid in log if i == 4}
    assert len(made) == 3
    paths = sorted(tuple(i for i, r in log if r == rid) for rid in made)
    # Stages: graphs, /proc facts, device times, stitcher, device wait, enrich, metrics, cost,
    # cost metrics, export. RequestOpened ends at the cost stage; ProcessSeen and the Request
    # go all the way.
    assert paths == [(4, 5, 6, 7), (4, 5, 6, 7, 8, 9), (4, 5, 6, 7, 8, 9)]
    (server,) = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]
    assert server.attributes[sc.GPU_LAUNCHES] == 3
    assert server.resource.attributes[sc.SERVICE_NAME] == "svc"
    assert server.attributes[sc.HTTP_ROUTE] == "/infer/{id}"
    kids = [s for s in spans.get_finished_spans() if s.parent and s.parent.span_id == server.context.span_id]
    assert sorted(k.attributes.get(sc.GPU_KERNEL_NAME, "") for k in kids) == ["", "k10", "k11", "k12"]


def test_no_stage_holds_another_stage(tmp_path):
    w, _, _ = wired(tmp_path)
    stages = w.pipeline.stages
    for s in stages:
        held = [v for v in vars(s).values()]
        assert not any(v is other for v in held for other in stages if other is not s), type(s).__name__
        assert not any(callable(v) and getattr(v, "__self__", None) in stages for v in held), type(s).__name__


def test_kernel_rollups_and_a_tick_make_an_outside_window(tmp_path):
    w, spans, _ = wired(tmp_path)
    launch = call_id("cudaLaunchKernel")
    w.pipeline.push([KernelRollup(PID, launch, 0xAB, 40, 0, 0, 5_000, None), Tick(6_000)])
    (root, rollup) = spans.get_finished_spans()
    assert root.name == "GPU work outside requests" and root.attributes[sc.GPU_LAUNCHES] == 40
    assert rollup.attributes[sc.GPU_ROLLUP_COUNT] == 40 and rollup.attributes[sc.GPU_KERNEL_NAME] == "kab"


def test_exit_closes_the_open_request_before_the_process_goes(tmp_path):
    w, spans, _ = wired(tmp_path)
    out = w.pipeline.push(request_events()[:-1] + [ProcExit(PID, 5_000, "svc")])
    assert type(out[-1]).__name__ == "ProcessGone"
    (server,) = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]
    assert server.status.description == "process exited"
    assert len(w.pipeline.stages[5].resources) == 0  # enrich forgot it, after its last records


def test_final_tick_releases_everything(tmp_path):
    w, spans, _ = wired(tmp_path)
    w.pipeline.push(request_events()[:-1])  # response never written
    assert spans.get_finished_spans() == ()
    w.pipeline.push([Tick(9_000, final=True)])
    (server, *_) = spans.get_finished_spans()
    assert server.status.description == "collector stopped"


def _points(reader, name):
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for m in sm.metrics:
                if m.name == name:
                    return {tuple(sorted(p.attributes.items())): getattr(p, "value", getattr(p, "count", None))
                            for p in m.data.data_points}
    return {}


def test_metrics_from_the_same_records(tmp_path):
    w, _, reader = wired(tmp_path, gpu_price="3600")
    w.pipeline.push(request_events(launches=2) + request_events(ts=9000, fd=8, launches=1))
    w.pipeline.push([KernelRollup(PID, call_id("cudaLaunchKernel"), 0x10, 5, 0, 0, 10_000), Tick(11_000)])
    launches = _points(reader, "gpu.cuda.kernel.launch.calls")
    route, device = (sc.HTTP_ROUTE, "/infer/{id}"), (sc.CUDA_DEVICE_INDEX, 0)
    assert launches[tuple(sorted([route, device, (sc.GPU_KERNEL_NAME, "k10"), (sc.SERVICE_NAME, "svc")]))] == 2
    assert launches[tuple(sorted([route, device, (sc.GPU_KERNEL_NAME, "k11"), (sc.SERVICE_NAME, "svc")]))] == 1
    assert launches[tuple(sorted([(sc.GPU_KERNEL_NAME, "k10"), (sc.SERVICE_NAME, "svc")]))] == 5  # outside
    copies = _points(reader, "gpu.cuda.memory.copies")  # a histogram: its count is the copies
    assert sum(copies.values()) == 2
    calls = _points(reader, "otel_gpu.cuda.calls")
    assert calls[((sc.GPU_ATTRIBUTION, "thread"),)] == 5 and calls[((sc.GPU_ATTRIBUTION, "outside"),)] == 5
    assert sum(_points(reader, "http.server.request.duration").values()) == 2
    assert sum(_points(reader, "otel_gpu.cost.gpu_seconds").values()) > 0


def test_live_memory_gauge_follows_malloc_and_free(tmp_path):
    w, _, reader = wired(tmp_path)
    malloc = cuda("cudaMalloc", func=0xD000, nbytes=4096, pid=PID, ts=1500)
    free = cuda("cudaFree", func=0xD000, pid=PID, ts=1600)
    evs = request_events()
    w.pipeline.push(evs[:2] + [malloc] + evs[2:])
    assert list(_points(reader, "gpu.memory.allocated").values()) == [4096]
    w.pipeline.push([free, Tick(2_000)])  # outside a request: in the outside window
    assert list(_points(reader, "gpu.memory.allocated").values()) == [0]


def test_cost_metrics_add_exact_split_and_outside(tmp_path):
    """Two overlapping requests and calls on a third thread (ambiguous), then calls after
    both finished (outside): the cost counters by share add up to the busy time."""
    w, _, reader = wired(tmp_path, gpu_price="3600")
    a, b = request_events(ts=1_000_000, fd=7, tid=1), request_events(ts=1_000_500, fd=8, tid=2)
    amb = [cuda("cudaDeviceSynchronize", pid=PID, tid=9, ts=1_000_600, duration=4_000_000)]
    w.pipeline.push(a[:-1] + b[:-1] + amb + [a[-1], b[-1]])
    w.pipeline.push([cuda("cudaDeviceSynchronize", pid=PID, tid=9, ts=9_000_000, duration=1_000_000),
                     Tick(20_000_000)])
    seconds = _points(reader, "otel_gpu.cost.gpu_seconds")
    by_share: dict = {}
    for labels, v in seconds.items():
        share = dict(labels)[sc.GPU_COST_SHARE]
        by_share[share] = by_share.get(share, 0) + v
    assert set(by_share) == {"exact", "split", "outside"}
    assert by_share["outside"] == pytest.approx(0.001)  # the sync at 9 ms, after both requests
    # The union of the busy time while requests were open: each request's own window
    # (first call to last call, 8 ns each) and the ambiguous sync (4 ms).
    assert by_share["exact"] == pytest.approx(16e-9)
    assert by_share["exact"] + by_share["split"] == pytest.approx(4_000_016e-9, rel=1e-9)
