"""CUDA discovery beyond the pip wheel: cudart linked statically by nvcc, the driver
API through a stub libcuda (no real driver exists without a GPU), and a process
that loads libcudart only after the collector started. The three share one collector
(shared_collector): each checks its own target's spans."""
from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from tests.harness import TARGETS, Target, children_of, server_spans

NVCC = shutil.which("nvcc") or next(iter(sorted(Path("/usr/local").glob("cuda*/bin/nvcc"))), None)


def _outside_windows(spans, pid):
    return [s for s in spans if s.attributes.get("otel_gpu.attribution") == "outside"
            and s.attributes.get("process.pid") == pid and s.parent_span_id == ""]


@pytest.mark.skipif(NVCC is None, reason="nvcc (CUDA toolkit) not installed")
def test_static_cudart_in_an_nvcc_built_program(tmp_path, shared_collector):
    exe = tmp_path / "static_launch"
    subprocess.run([str(NVCC), "-o", str(exe), str(TARGETS / "static_launch.cu")], check=True)
    collector, receiver = shared_collector, shared_collector.receiver
    target = Target([str(exe), "25"])
    try:
        collector.wait_traced(target.pid)
        target.go_raw()
        assert target.log.wait_for("launched 25", 20)
        ok = receiver.wait_for(lambda s: sum(w.attributes["gpu.launches"] for w in _outside_windows(s, target.pid)) >= 25)
        assert ok, collector.log.lines
        windows = _outside_windows(receiver.spans, target.pid)
        assert sum(w.attributes["gpu.launches"] for w in windows) == 25
        kids = [k for w in windows for k in children_of(receiver.spans, w)]
        assert sum(k.attributes["gpu.rollup.count"] for k in kids) == 25
        assert {k.attributes.get("gpu.kernel.name") for k in kids} == {"scale_kernel(float*, int)"}
        assert windows[0].resource["service.name"] == "static_launch"
    finally:
        target.stop()


def _build_stub_libcuda(tmp_path) -> str:
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(TARGETS / "stub_libcuda.c")], check=True)
    return str(lib)


def test_driver_api_launches_and_one_count_per_launch(tmp_path, shared_collector, start_target):
    stub = _build_stub_libcuda(tmp_path)
    cudart = tmp_path / "libcudart-stub.so"  # reaches the stub libcuda, as the real one does on a GPU
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(cudart), str(TARGETS / "stub_cudart_driver.c"),
                    f"-L{tmp_path}", "-l:libcuda.so.1", f"-Wl,-rpath,{tmp_path}"], check=True)
    collector, receiver = shared_collector, shared_collector.receiver
    target = start_target(env={"STUB_LIBCUDA": stub, "STUB_CUDART": str(cudart)})
    collector.wait_traced(target.pid)
    assert collector.log.wait_for(stub, 10), "stub libcuda not probed"  # this test's own copy
    target.go()
    target.get("/driver?launches=3")
    target.get("/both")
    assert receiver.wait_for(lambda s: {x.attributes.get("http.route") for x in server_spans(s, target.pid)}
                             >= {"/driver", "/both"})
    spans = {s.attributes["http.route"]: s for s in server_spans(receiver.spans, target.pid)}
    driver = children_of(receiver.spans, spans["/driver"])
    assert [c.name for c in driver] == ["cuLaunchKernel"] * 3, collector.log.lines
    assert driver[0].attributes["gpu.grid"] == [7, 3, 1] and driver[0].attributes["gpu.block"] == [128, 2, 1]
    assert driver[0].attributes["gpu.shared_memory.bytes"] == 256
    # Same dims on one thread: a runtime launch, a driver launch of our own (the old 10 ms
    # rule dropped it), a runtime launch passing through cuLaunchKernel (counted once).
    both = children_of(receiver.spans, spans["/both"])
    assert [c.name for c in both] == ["cudaLaunchKernel", "cuLaunchKernel", "cudaLaunchKernel"]
    assert spans["/both"].attributes["gpu.launches"] == 3


def test_process_that_loads_cudart_after_the_collector_started(shared_collector):
    collector, receiver = shared_collector, shared_collector.receiver
    code = ("import sys; print('listening on 0', file=sys.stderr, flush=True); sys.stdin.readline();"
            "from otel_gpu.demo.cuda_work import CudaWork; w = CudaWork();"
            "print('loaded', file=sys.stderr, flush=True); sys.stdin.readline();"
            "[w.launch('softmax', (2, 1, 1), (32, 1, 1)) for _ in range(7)];"
            "print('launched', file=sys.stderr, flush=True); sys.stdin.readline()")
    target = Target([sys.executable, "-c", code])
    try:
        target.go_raw()  # now it dlopens libcudart
        assert target.log.wait_for("loaded", 20)
        collector.wait_traced(target.pid)
        target.go_raw()
        assert target.log.wait_for("launched", 20)
        assert receiver.wait_for(lambda s: sum(w.attributes["gpu.launches"] for w in _outside_windows(s, target.pid)) >= 7)
        assert sum(w.attributes["gpu.launches"] for w in _outside_windows(receiver.spans, target.pid)) == 7
    finally:
        target.stop()
