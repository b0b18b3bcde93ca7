"""A front-end + GPU-worker pair (targets/batch_pair.py) under 8 concurrent clients: the
worker's batch steps are `shared` window spans, cut at its synchronize, linked to the
requests of the batch (and only to requests in flight), never parented under a request;
the front-end's server spans have no CUDA children; the windows' cost is split among
their links and adds up."""
from __future__ import annotations

import re
import sys
import time
import urllib.request
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.bpf.targets.batch_pair import LAUNCHES
from tests.bpf.targets.relia_support import stopped_counters
from tests.harness import TARGETS, Target, children_of, server_spans

CLIENTS, REQUESTS = 8, 48
STEP_RE = re.compile(r"step (\d+) ids ((?:\d+ ?)+)$")


@pytest.fixture
def pair():
    started = []

    def start() -> Target:
        started.append(Target([sys.executable, str(TARGETS / "batch_pair.py"), "0"]))
        return started[-1]
    yield start
    for t in started:
        t.stop()


def _steps(front: Target, timeout: float = 10) -> dict:
    """step -> request ids of its batch, from the worker's lines (all of them once every
    id is in: a step is printed before its requests are answered)."""
    deadline = time.monotonic() + timeout
    while True:
        steps = {}
        for line in list(front.log.lines):
            m = STEP_RE.search(line.strip())
            if m:
                steps[int(m.group(1))] = {int(x) for x in m.group(2).split()}
        if sum(map(len, steps.values())) >= REQUESTS or time.monotonic() > deadline:
            return steps
        time.sleep(0.05)


def _logged_after(collector, first: str, then: str, timeout: float = 10) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        lines = list(collector.log.lines)
        i = next((n for n, line in enumerate(lines) if first in line), None)
        if i is not None and any(then in line for line in lines[i:]):
            return True
        time.sleep(0.05)
    return False


def _get(port: int, rid: int) -> bytes:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/gen/{rid}", timeout=20).read()


def test_batch_steps_are_shared_windows_linked_to_their_requests(receiver, start_collector, pair):
    collector = start_collector("--gpu-price", "3.6")
    front = pair()
    worker = int(next(l for l in front.log.lines if "listening on" in l).split()[4])
    collector.wait_traced(worker)
    collector.wait_traced(front.pid)
    # The worker follows the front-end (alone, or with other related servers) once both are traced.
    assert _logged_after(collector, f"tracing pid {front.pid}", f"pid {worker}: CUDA calls streamed while"), \
        collector.log.lines[-10:]
    front.go()
    with ThreadPoolExecutor(CLIENTS) as pool:
        assert list(pool.map(lambda i: _get(front.port, i), range(REQUESTS))) == [b"ok"] * REQUESTS

    steps = _steps(front)  # step -> request ids of its batch
    assert sorted(i for ids in steps.values() for i in ids) == list(range(REQUESTS))
    assert any(len(ids) > 1 for ids in steps.values()), steps  # the clients' requests did batch

    def shared(spans):
        return [s for s in spans if s.parent_span_id == "" and s.attributes.get("process.pid") == worker
                and s.attributes.get("otel_gpu.attribution") == "shared"]
    assert receiver.wait_for(lambda spans: sum(s.attributes["gpu.launches"] for s in shared(spans))
                             >= LAUNCHES * len(steps), 30), collector.log.lines[-15:]
    assert receiver.wait_for(lambda spans: len([s for s in server_spans(spans, front.pid)
                                                if s.attributes["url.path"].startswith("/gen/")]) >= REQUESTS)
    assert collector.stop() == 0
    spans = receiver.spans
    servers = {int(s.attributes["url.path"][5:]): s for s in server_spans(spans, front.pid)
               if s.attributes["url.path"].startswith("/gen/")}
    assert sorted(servers) == list(range(REQUESTS))
    for s in server_spans(spans, front.pid):
        assert children_of(spans, s) == [] and s.attributes["gpu.calls"] == 0

    # Every CUDA call of the worker is on a shared window, one window per batch step.
    worker_calls = [s for s in spans if s.attributes.get("gpu.cuda.call") and s.resource.get("process.pid") == worker]
    windows = {s.span_id: s for s in shared(spans)}
    assert len(worker_calls) == (LAUNCHES + 1) * len(steps)
    assert all(c.parent_span_id in windows and c.attributes["otel_gpu.attribution"] == "shared"
               for c in worker_calls)
    assert not [s for s in spans if s.attributes.get("process.pid") == worker and s.parent_span_id == ""
                and s.attributes.get("otel_gpu.attribution") != "shared"]
    # (The collector traces every CUDA process on the host: its counters are at least ours.)
    assert stopped_counters(collector)["attributed.shared"] >= (LAUNCHES + 1) * len(steps)

    by_span = {(s.trace_id, s.span_id): rid for rid, s in servers.items()}
    assert len(windows) == len(steps)
    for w in windows.values():
        assert w.name == "GPU work, shared by requests"
        kids = children_of(spans, w)
        assert [k.name for k in kids].count("cudaLaunchKernel") == LAUNCHES
        assert kids[-1].name == "cudaDeviceSynchronize"  # the window ends at the step's sync
        (step,) = {k.attributes["gpu.grid"][0] for k in kids if k.name == "cudaLaunchKernel"}
        linked = {by_span[link] for link in w.links}
        in_flight = {rid for rid, s in servers.items() if s.start_ns <= w.end_ns and s.end_ns >= w.start_ns}
        assert steps[step] <= linked <= in_flight, (step, steps[step], linked, in_flight)
        assert w.attributes["otel_gpu.candidate_requests"] == len(linked)
        # Cost: the window's GPU time, split among its links, adds up.
        split = w.attributes["otel_gpu.cost.split.gpu_seconds"]
        assert len(split) == len(w.links)
        assert sum(split) == pytest.approx(w.attributes["otel_gpu.cost.gpu_seconds"], rel=1e-9, abs=1e-12)
        assert w.attributes["otel_gpu.cost.gpu_seconds"] > 0
        assert set(w.attributes["otel_gpu.cost.split.features"]) <= {"/gen/{id}"}
