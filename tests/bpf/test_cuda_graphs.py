"""CUDA graphs with the real probes in the real kernel, end to end through `otel-gpu run`:
a target captures a graph at warm-up (outside any request) through stub runtime and
driver libraries exporting the real symbols and signatures (the real libcudart cannot
capture without a device), replays it outside requests, then inside one. Launches on
the capturing stream are recorded, never counted as run; each graph launch names the
captured kernels with counts, in the request and in the outside rollups; the driver's
cuGraphLaunch under cudaGraphLaunch is not counted twice."""
from __future__ import annotations

import sys

from otel_gpu.probes.launch_routes import at_driver_line, graphs_at_driver_line
from tests.bpf.probe_harness import build_stub
from tests.harness import TARGETS, Target, children_of, server_spans

GEMM, RELU, COPY = "gemm_tile(float*, int)", "relu(float*, int)", "copy_side(float*, int)"
REPLAYS = 5  # targets/graph_http.py



def _pid_of(span) -> int | None:
    return span.attributes.get("process.pid") or span.resource.get("process.pid")


def _outside(spans, pid: int) -> list:
    return [s for s in spans if s.name == "GPU work outside requests" and _pid_of(s) == pid]


def test_graph_launches_name_the_captured_kernels(tmp_path, receiver, start_collector):
    env = {"STUB_LIBCUDA": build_stub(tmp_path, "stub_libcuda_graphs.c", "libcuda.so.1"),
           "STUB_CUDART": build_stub(tmp_path, "stub_cudart_graphs.c", "libcudart.so.12")}
    collector = start_collector()
    target = Target([sys.executable, str(TARGETS / "graph_http.py")], env)
    try:
        collector.wait_traced(target.pid)
        for name in ("libcuda.so.1", "libcudart.so.12"):
            assert collector.log.wait_for(f"{tmp_path}/{name}", 20), f"{name} not probed:\n{collector.log.lines}"
        target.go()
        assert target.log.wait_for("warm", 10)
        target.get("/graph")
        assert receiver.wait_for(lambda s: any(x.attributes.get("http.route") == "/graph"
                                               for x in server_spans(s, target.pid)), 30)
        # The outside window of the warm-up: the replays (counted in the kernel) and copy_side.
        def outside_launches(spans) -> int:
            return sum(s.attributes.get("gpu.launches", 0) for s in _outside(spans, target.pid))
        assert receiver.wait_for(lambda s: outside_launches(s) >= REPLAYS + 1, 30), collector.log.lines
        spans = list(receiver.spans)
        (server,) = [x for x in server_spans(spans, target.pid) if x.attributes.get("http.route") == "/graph"]
        kids = children_of(spans, server)
        assert [k.name for k in kids] == ["cudaGraphLaunch"] * 2, [k.attributes for k in kids]
        for k in kids:
            assert list(k.attributes["gpu.graph.kernels"]) == [GEMM, RELU]
            assert list(k.attributes["gpu.graph.kernel_counts"]) == [3, 1]
            assert k.attributes["gpu.graph.kernel_nodes"] == 4
        assert server.attributes["gpu.launches"] == 2
        assert server.attributes["gpu.graph.kernel_launches"] == 8
        # Outside requests: the replays as graph launches naming the same kernels, and the
        # one launch that ran during the capture (another stream). The 4 recorded
        # launches are counted nowhere.
        outside = _outside(spans, target.pid)
        assert outside_launches(spans) == REPLAYS + 1
        assert sum(s.attributes.get("gpu.graph.kernel_launches", 0) for s in outside) == 4 * REPLAYS
        children = [c for s in outside for c in children_of(spans, s)]
        ran = [c.attributes.get("gpu.kernel.name") for c in children if c.attributes.get("gpu.cuda.call") == "cudaLaunchKernel"]
        assert ran == [COPY], [c.attributes for c in children]
        replays = [c for c in children if c.attributes.get("gpu.cuda.call") == "cudaGraphLaunch"]
        assert sum(c.attributes.get("gpu.rollup.count", 1) for c in replays) == REPLAYS
        for c in replays:
            assert list(c.attributes["gpu.graph.kernels"]) == [GEMM, RELU]
            assert list(c.attributes["gpu.graph.kernel_counts"]) == [3, 1]
    finally:
        target.stop()


def test_graph_launches_count_once_at_the_driver_once_seen_reaching_it(tmp_path, receiver, start_collector):
    """The warm-up's replays reach cuGraphLaunch from libcudart while the process learns:
    its runtime graph launch probes go (one program run a graph launch from then on). Its
    kernel launches never reach the driver here (the stand-in runtime keeps them), so no
    pair is made and its kernel launch probes stay: each request's own launch is still
    counted. Request n makes n graph launches and one copy_side launch of grid (n, 1, 1):
    each span's children are exactly its own, named, counted once."""
    env = {"STUB_LIBCUDA": build_stub(tmp_path, "stub_libcuda_graphs.c", "libcuda.so.1"),
           "STUB_CUDART": build_stub(tmp_path, "stub_cudart_graphs.c", "libcudart.so.12")}
    collector = start_collector()
    target = Target([sys.executable, str(TARGETS / "graph_http.py")], env)
    sizes = range(1, 5)
    try:
        collector.wait_traced(target.pid)
        target.go()
        assert target.log.wait_for("warm", 10)
        assert collector.log.wait_for(graphs_at_driver_line(target.pid), 30), collector.log.lines[-20:]
        for n in sizes:
            target.get(f"/graph/{n}")
        paths = {f"/graph/{n}" for n in sizes}
        assert receiver.wait_for(lambda s: paths <= {x.attributes.get("url.path") for x in server_spans(s, target.pid)})
        spans = list(receiver.spans)
        for n in sizes:
            (server,) = [x for x in server_spans(spans, target.pid) if x.attributes.get("url.path") == f"/graph/{n}"]
            kids = children_of(spans, server)
            graphs = [k for k in kids if k.name == "cudaGraphLaunch"]
            assert len(graphs) == n and len(kids) == n + 1, [k.attributes for k in kids]
            for k in graphs:
                assert list(k.attributes["gpu.graph.kernels"]) == [GEMM, RELU]
                assert list(k.attributes["gpu.graph.kernel_counts"]) == [3, 1]
            (own,) = [k for k in kids if k.name == "cudaLaunchKernel"]
            assert own.attributes["gpu.kernel.name"] == COPY and list(own.attributes["gpu.grid"]) == [n, 1, 1]
        assert not collector.log.wait_for(at_driver_line(target.pid), 0.1)  # no pair: kernels at the runtime
    finally:
        target.stop()
    assert collector.stop() == 0
    counted = collector.counts()["counted"]
    # The replays while learning: dropped at the driver; each request's: counted there.
    assert counted.get("driver_launches_deduped") == REPLAYS
    assert counted.get("driver_launches_as_runtime") == sum(sizes)

