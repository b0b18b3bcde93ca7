"""No blind start: requests sent the moment a CUDA HTTP server listens, with no wait
for the collector to report it traced, all get their server span with exact CUDA
children. The known libcudart files are probed before the server starts, and its
load of libcudart (a uprobe on the library's DT_INIT) marks it traced and has it
scanned at once: for the default mode and for the asyncio server (uvicorn), whose
Python-context probes come from that same scan. With --exe the first requests are
exact or absent (per-process probes come from that scan). A
libcudart at a path no probe knows is still found, by the periodic /proc scan.

Real probes, the real libcudart wheel, real stdlib and uvicorn servers."""
from __future__ import annotations

import os
import shutil
import sys
import time
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.bpf.targets.first_requests import send_first_requests, start_server as _start
from tests.harness import TARGETS, Target, children_of, server_spans

REQUESTS = 5


def _first_requests(target) -> None:
    """Request i makes i launches."""
    assert send_first_requests(target, [f"/work?launches={i}" for i in range(1, REQUESTS + 1)]) == REQUESTS


def _assert_all_traced(receiver, collector, target: Target) -> None:
    def complete(spans):
        return len([s for s in server_spans(spans, target.pid) if s.attributes.get("http.route") == "/work"]) >= REQUESTS
    assert receiver.wait_for(complete, 30), "".join(collector.log.lines[-30:])
    spans = [s for s in server_spans(receiver.spans, target.pid) if s.attributes.get("http.route") == "/work"]
    by_launches = sorted(s.attributes["gpu.launches"] for s in spans)
    assert by_launches == list(range(1, REQUESTS + 1))
    for span in spans:
        kids = children_of(receiver.spans, span)
        assert [k.name for k in kids] == ["cudaLaunchKernel"] * span.attributes["gpu.launches"]
        assert all(k.attributes["gpu.grid"] == [7, 3, 1] for k in kids)


# First: a collector of its own (--exe); the tests after it share one (shared_collector).
def test_exe_filter_first_requests_exact_or_absent(receiver, start_collector):
    """--exe: per-process probes are attached when the load probe has user space scan
    the process (not ahead of it), so a server answering within milliseconds of loading
    libcudart may have calls of its first requests unseen: such a request has no span,
    or one that says so (otel_gpu.calls.before_probes), never one with wrong counts that
    does not; every request after it is traced has its exact span."""
    name = f"firstreq{os.getpid() % 10000}"
    collector = start_collector("--exe", name)
    target = _start("stdlib", name)
    try:
        _first_requests(target)
        collector.wait_traced(target.pid)
        later = range(REQUESTS + 1, 2 * REQUESTS + 1)
        assert send_first_requests(target, [f"/work?launches={i}" for i in later]) == REQUESTS
        assert receiver.wait_for(lambda s: {x.attributes.get("gpu.launches") for x in server_spans(s, target.pid)}
                                 >= set(later), 30), "".join(collector.log.lines[-30:])
        time.sleep(1)  # the first requests' spans, if any, were exported before the later ones
        spans = [s for s in server_spans(receiver.spans, target.pid) if s.attributes.get("http.route") == "/work"]
        partial = [s for s in spans if s.attributes.get("otel_gpu.calls.before_probes")]
        launches = sorted(s.attributes["gpu.launches"] for s in spans if s not in partial)
        assert set(later) <= set(launches) <= set(range(1, 2 * REQUESTS + 1)) and len(set(launches)) == len(launches)
        assert len(spans) <= 2 * REQUESTS and all(s.attributes["gpu.launches"] <= REQUESTS for s in partial)
        for span in spans:
            assert len(children_of(receiver.spans, span)) == span.attributes["gpu.launches"]
        assert any(f"for pid {target.pid} only" in l for l in collector.log.lines)  # per-process probes
        print(f"--exe: of the first {REQUESTS} requests {len(launches) - REQUESTS} traced exactly, "
              f"{len(partial)} marked as begun before the probes")
    finally:
        target.stop()


@pytest.mark.parametrize("kind", ["stdlib", "asgi"])
def test_first_requests_after_start_are_traced(shared_collector, kind):
    collector, receiver = shared_collector, shared_collector.receiver
    target = _start(kind)
    try:
        _first_requests(target)
        _assert_all_traced(receiver, collector, target)
    finally:
        target.stop()


def test_interleaved_asyncio_first_requests_keep_their_own_calls(shared_collector):
    """FastAPI `async def` on uvicorn, 8 concurrent requests from the moment it listens,
    each yielding to the loop between its calls: every span has exactly its own launches
    (grid x = its id), so the Python-context probes were ready (the load probe's scan
    runs while the framework imports, after libcudart is loaded)."""
    collector, receiver = shared_collector, shared_collector.receiver
    target = Target([sys.executable, str(TARGETS / "async_servers.py"), "fastapi-async", "0"])
    ids = range(1, 9)
    try:
        target.go_raw()
        with ThreadPoolExecutor(len(ids)) as pool:
            answered = list(pool.map(lambda i: send_first_requests(target, [f"/infer?id={i}&launches=4"], go=False), ids))
        assert answered == [1] * len(ids)
        assert receiver.wait_for(lambda s: len(server_spans(s, target.pid)) >= len(ids), 30), \
            "".join(collector.log.lines[-30:])
        owners = []
        for span in server_spans(receiver.spans, target.pid):
            kids = [k for k in children_of(receiver.spans, span) if k.name == "cudaLaunchKernel"]
            assert len(kids) == span.attributes["gpu.launches"] == 4
            grids = {k.attributes["gpu.grid"][0] for k in kids}
            assert len(grids) == 1  # one request's calls only
            owners += grids
        assert sorted(owners) == list(ids)
    finally:
        target.stop()


FIRST_REQUEST_S = 0.3  # after the server process starts


@pytest.mark.parametrize("mode", ["default", "exe"])
def test_first_requests_at_an_unknown_path_are_traced(tmp_path, receiver, start_collector, mode):
    """libcudart copied to a directory no probe knows (as a container's file looks from
    the host): the open tracepoint has the process scanned and the file probed as it is
    opened, so requests from FIRST_REQUEST_S after the server starts all have their exact
    spans, in the default mode (file-wide probes) and with --exe (this process's own)."""
    from otel_gpu.demo.cuda_work import find_cudart
    copy = tmp_path / "app" / "lib" / "libcudart.so.12"
    copy.parent.mkdir(parents=True)
    shutil.copy(find_cudart(), copy)
    name = f"newpath{os.getpid() % 10000}"
    collector = start_collector(*(["--exe", name] if mode == "exe" else []))
    t0 = time.monotonic()
    target = _start("stdlib", name, env={"OTEL_GPU_CUDART": str(copy)})
    try:
        time.sleep(max(0.0, t0 + FIRST_REQUEST_S - time.monotonic()))
        first_s = time.monotonic() - t0
        _first_requests(target)
        _assert_all_traced(receiver, collector, target)
        assert any(str(copy) in line and "attached" in line for line in collector.log.lines)
        print(f"{mode}: first request {first_s:.2f} s after the start of a server whose libcudart is at a new path: "
              f"all {REQUESTS} traced")
    finally:
        target.stop()
