"""HIP services traced as CUDA ones are, end to end through `otel-gpu run`: the real probes
on Debian's real libamdhip64 (no AMD GPU here: each call fails at once, with the real
arguments), a stdlib threaded and an asyncio (uvicorn) server (tests/bpf/targets/hip_http.py),
1, 8 and 32 clients at once. Each request's calls carry its number k (grids, copy and
allocation sizes, streams, graph execs) and its span names k (url.path), so a call under
another request fails. Kernel names come from the handles' symbols (hipcc's kernel handle
objects) and from __hipRegisterFunction. Also: a server's first requests, sent the moment
it listens; launches with no request open, counted."""
from __future__ import annotations

import shutil
import subprocess
import sys
import threading
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest

from otel_gpu.demo.runner import free_port
from tests.bpf.targets.first_requests import send_first_requests
from tests.bpf.targets.hip_http import find_hip
from tests.harness import TARGETS, Target, children_of, module_collector, server_spans
from tests.support.placement import max_overlap

pytestmark = pytest.mark.skipif(not Path(find_hip()).exists(), reason="no libamdhip64 (make setup installs it)")

VECTOR_ADD = "vector_add(float const*, float const*, float*, int)"
REDUCE_SUM = "reduce_sum(float const*, float*, int)"
SOFTMAX = "softmax_rowwise(float*, int)"  # named only by its registration


def expected(k: int) -> list[tuple]:
    """(span name, what it must say) of request k's calls, in call order (hip_http.py)."""
    stream = {"gpu.stream": hex(0x5000 + k)}
    return [
        ("hipMemcpyHtoD", {"gpu.memcpy.bytes": 100000 + k, "gpu.memcpy.direction": "h2d"}),
        ("hipLaunchKernel", {"gpu.kernel.name": VECTOR_ADD, "gpu.grid": [k, 1, 1], "gpu.block": [128, 1, 1],
                             "gpu.shared_memory.bytes": 16 * k, **stream}),
        ("hipExtLaunchKernel", {"gpu.kernel.name": REDUCE_SUM, "gpu.grid": [k, 2, 1], "gpu.block": [64, 1, 1],
                                **stream}),
        ("hipLaunchKernel", {"gpu.kernel.name": SOFTMAX, "gpu.grid": [k, 1, 3], "gpu.block": [32, 1, 1], **stream}),
        ("hipModuleLaunchKernel", {"gpu.kernel.func": hex(0x7A00), "gpu.grid": [k, 1, 1], "gpu.block": [256, 1, 1],
                                   **stream}),
        ("hipGraphLaunch", stream),
        ("hipMemcpyAsync", {"gpu.memcpy.bytes": 200000 + k, "gpu.memcpy.direction": "d2h", **stream}),
        ("hipMalloc", {"gpu.alloc.bytes": 4096 + k}),
        ("hipFree", {}),
        ("hipStreamSynchronize", stream),
    ]


def kernels_library(tmp: Path) -> str:
    out = tmp / "libhipkernels.so"
    if not out.exists():
        subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(out), str(TARGETS / "hip_kernels.c")], check=True)
    return str(out)


@pytest.fixture(scope="module")
def collector():
    with module_collector("--flush-interval", "1") as c:
        yield c


def start_server(kind: str, tmp: Path) -> Target:
    port = free_port() if kind == "asgi" else 0
    return Target([sys.executable, str(TARGETS / "hip_http.py"), kind, str(port), kernels_library(tmp)])


def infer_spans(spans, pid: int) -> dict:
    return {int(s.attributes["url.path"].rsplit("/", 1)[1]): s for s in server_spans(spans, pid)
            if s.attributes.get("url.path", "").startswith("/infer/")}


def check_request(spans, span, k: int) -> None:
    """Exactly request k's calls, in order, each saying what k made it say."""
    kids = sorted(children_of(spans, span), key=lambda c: c.start_ns)
    want = expected(k)
    assert [c.name for c in kids] == [name for name, _ in want], f"request {k} ({span.status_message or 'no error'})"
    for c, (name, attrs) in zip(kids, want):
        got = {key: c.attributes.get(key) for key in attrs}
        assert got == attrs, f"request {k}, {name}"
        assert c.attributes["gpu.hip.call"] == name and "gpu.cuda.call" not in c.attributes
        if name in ("hipMalloc", "hipStreamSynchronize"):  # return probes: hipErrorInvalidDevice without a GPU
            assert c.attributes["gpu.hip.return_code"] == 101 and "gpu.cuda.return_code" not in c.attributes
        assert c.attributes["otel_gpu.attribution"] in ("thread", "task")
    assert span.attributes["gpu.launches"] == 5  # four kernels and one graph
    assert span.attributes["gpu.memcpy.h2d.bytes"] == 100000 + k
    assert span.attributes["gpu.memcpy.d2h.bytes"] == 200000 + k
    assert span.attributes.get("otel_gpu.calls.ambiguous", 0) == 0


@pytest.mark.parametrize("clients", [1, 8, 32])
@pytest.mark.parametrize("kind", ["stdlib", "asgi"])
def test_each_request_gets_exactly_its_hip_calls(collector, tmp_path_factory, kind, clients):
    receiver = collector.receiver
    target = start_server(kind, tmp_path_factory.mktemp("hip"))
    try:
        collector.wait_traced(target.pid, 60)
        target.go()
        ks = range(1, max(4, clients) + 1)
        gate = threading.Barrier(clients, timeout=30)

        def client(first: int) -> None:
            gate.wait()  # all at once
            for k in ks[first::clients]:
                assert target.get(f"/infer/{k}") == b"ok"
        with ThreadPoolExecutor(clients) as pool:
            list(pool.map(client, range(clients)))
        assert receiver.wait_for(lambda s: len(infer_spans(s, target.pid)) >= len(ks), 60), \
            "".join(collector.log.lines[-30:])
        spans = infer_spans(receiver.spans, target.pid)
        assert sorted(spans) == list(ks)
        for k, span in spans.items():
            check_request(receiver.spans, span, k)
        if clients > 1:
            assert max_overlap(list(spans.values())) >= 2
    finally:
        target.stop()


def test_first_requests_and_calls_outside_requests(collector, tmp_path_factory):
    """Requests sent the moment the server listens (no wait for `tracing pid`): the known
    libamdhip64 is probed before it starts, and its load marks the process traced. Then
    launches with no request open: counted on an outside window, none lost."""
    receiver = collector.receiver
    target = start_server("stdlib", tmp_path_factory.mktemp("hip"))
    try:
        assert send_first_requests(target, [f"/infer/{k}" for k in range(1, 4)]) == 3
        assert receiver.wait_for(lambda s: len(infer_spans(s, target.pid)) >= 3, 60), \
            "".join(collector.log.lines[-30:])
        for k, span in infer_spans(receiver.spans, target.pid).items():
            check_request(receiver.spans, span, k)
        target.proc.stdin.write("outside 7\n")
        target.proc.stdin.flush()
        assert target.log.wait_for("outside done", 30)

        def outside(spans):
            return sum(s.attributes.get("gpu.launches", 0) for s in spans
                       if s.attributes.get("process.pid") == target.pid
                       and s.attributes.get("otel_gpu.attribution") == "outside")
        assert receiver.wait_for(lambda s: outside(s) >= 7, 30), "".join(collector.log.lines[-30:])
        assert outside(receiver.spans) == 7
    finally:
        target.stop()


def test_a_libamdhip64_at_a_path_no_probe_knows(collector, tmp_path_factory):
    """A venv's or a container's copy: found when the process opens it (the openat watch),
    probed by its own path, and its requests as exact as the known file's."""
    tmp = tmp_path_factory.mktemp("hip")
    copy = tmp / "rocm/lib/libamdhip64.so.5"
    copy.parent.mkdir(parents=True)
    shutil.copy(find_hip(), copy)
    receiver = collector.receiver
    target = Target([sys.executable, str(TARGETS / "hip_http.py"), "stdlib", "0", kernels_library(tmp)],
                    {"OTEL_GPU_HIP": str(copy)})
    try:
        assert collector.log.wait_for(str(copy), 30), "the copy was not probed"
        collector.wait_traced(target.pid, 60)
        target.go()
        ks = range(1, 9)
        with ThreadPoolExecutor(8) as pool:
            assert list(pool.map(lambda k: target.get(f"/infer/{k}"), ks)) == [b"ok"] * 8
        assert receiver.wait_for(lambda s: len(infer_spans(s, target.pid)) >= 8, 60), \
            "".join(collector.log.lines[-30:])
        spans = infer_spans(receiver.spans, target.pid)
        assert sorted(spans) == list(ks)
        for k, span in spans.items():
            check_request(receiver.spans, span, k)
    finally:
        target.stop()
