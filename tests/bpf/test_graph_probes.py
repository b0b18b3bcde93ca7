"""CUDA graph probes (bpf/graph_probes.c) with the real probes in the real kernel, on a
child process driven one call batch at a time:

- cuGraphLaunch is dropped only when its caller is the process's CUDA runtime
  (cudaGraphLaunch passing through the driver, from a stub libcudart that reaches the
  stub libcuda as the real one does on a GPU); a cuGraphLaunch of the same exec on the
  same thread right after a runtime graph launch that did not reach the driver (the
  real libcudart here) is a launch of its own. The old same-thread/same-exec rule
  dropped it.
- Every graph op (capture begin/end, instantiate, destroy; runtime and driver) arrives
  with its stream, graph and exec.
- A process that exits with a capture open leaves no capture state behind: its
  capture_procs entry goes and the global "captures open" switch is back to 0, so
  launches on the host stop paying the capture lookup."""
from __future__ import annotations

import ctypes as ct
import sys
import time

import pytest

from otel_gpu import proc
from otel_gpu.kernel_io.abi import CNT_DRIVER_DEDUPED
from otel_gpu.records import GraphCall, GraphOp
from otel_gpu.probes import runtime_text
from otel_gpu.probes.discovery import libraries_in_maps
from otel_gpu.cuda_calls import CALLS, DRIVER, RUNTIME, Category, call_id
from tests.bpf.probe_harness import Child, Probes, build_stub

EXEC, STREAM = 0x6A000, 0x5100
# The child: the stub libcuda (RTLD_GLOBAL: the stub runtime finds the driver's graph
# calls as libcudart does), a stub libcudart that reaches it, and the real libcudart
# (no driver here: its graph launch returns 35 before any driver call). Its own
# cuGraphLaunch calls (through ctypes) stand for a library launching the exec itself.
CHILD = r'''
import ctypes as ct, json, os, sys
from otel_gpu.demo.cuda_work import find_cudart
vp = ct.c_void_p
drv = ct.CDLL(sys.argv[1], mode=ct.RTLD_GLOBAL)
stub_rt = ct.CDLL(sys.argv[2])
real_rt = ct.CDLL(find_cudart())
EXEC, STREAM = int(sys.argv[3]), int(sys.argv[4])
for f in (drv.cuGraphLaunch, stub_rt.cudaGraphLaunch, real_rt.cudaGraphLaunch):
    f.argtypes = [vp, vp]
stub_rt.cudaStreamBeginCapture.argtypes = [vp, ct.c_int]

def fooled():
    """A runtime graph launch that never reaches the driver, then the same exec launched
    through the driver from elsewhere on the same thread: two launches."""
    out = []
    for _ in range(3):
        out.append(real_rt.cudaGraphLaunch(EXEC, STREAM))
        out.append(drv.cuGraphLaunch(EXEC, STREAM))
    return out

def through():
    """Runtime graph launches reaching cuGraphLaunch from libcudart's code: once each;
    each followed by a launch of the same exec from elsewhere: counted."""
    out = []
    for _ in range(3):
        out.append(stub_rt.cudaGraphLaunch(EXEC, STREAM))
        out.append(drv.cuGraphLaunch(EXEC, STREAM))
    return out

def begin_capture():
    return [stub_rt.cudaStreamBeginCapture(STREAM, 0)]

def ops():
    """Every graph call of the runtime (each reaching the driver's, as libcudart does):
    capture begin/end on STREAM, instantiate, destroy the graph, then the exec."""
    stub_rt.cudaStreamEndCapture.argtypes = [vp, ct.POINTER(vp)]
    stub_rt.cudaGraphInstantiate.argtypes = [ct.POINTER(vp), vp, ct.c_ulonglong]
    for name in ("cudaGraphDestroy", "cudaGraphExecDestroy"):
        getattr(stub_rt, name).argtypes = [vp]
    graph, graph_exec = vp(0), vp(0)
    rets = [stub_rt.cudaStreamBeginCapture(STREAM, 0), stub_rt.cudaStreamEndCapture(STREAM, ct.byref(graph)),
            stub_rt.cudaGraphInstantiate(ct.byref(graph_exec), graph, 0)]
    rets += [stub_rt.cudaGraphDestroy(graph), stub_rt.cudaGraphExecDestroy(graph_exec)]
    return {"rets": rets, "graph": graph.value, "exec": graph_exec.value}

def exit_now():
    os._exit(0)  # the capture begun is still open

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    print(json.dumps(globals()[line.strip()]()), flush=True)
'''



@pytest.fixture
def child(probes, tmp_path):
    drv = build_stub(tmp_path, "stub_libcuda_graphs.c", "libcuda.so.1")
    stub_rt = build_stub(tmp_path, "stub_cudart_graphs.c", "libcudart-graphs.so")
    c = Child([sys.executable, "-c", CHILD, drv, stub_rt, str(EXEC), str(STREAM)])
    runtimes = {p for kind, p in libraries_in_maps(proc.maps("/proc", c.pid)) if kind == RUNTIME}
    assert stub_rt in runtimes and len(runtimes) == 2, runtimes  # the stub and the real libcudart
    assert probes.attach(DRIVER, drv, c.pid) >= 3  # cuGraphLaunch, capture begin/end, ...
    for path in runtimes:
        assert probes.attach(RUNTIME, path, c.pid) >= 2
    # What the collector does at its scan: the child's runtime code ranges, from its maps.
    ranges = runtime_text.runtime_ranges(proc.maps("/proc", c.pid), runtimes)
    assert len(ranges) == 2, ranges
    runtime_text.write(probes.bpf["runtime_text"], c.pid, ranges)
    yield c
    if c.proc.poll() is None:
        c.stop()
    for table in ("runtime_text", "http_active"):
        probes.unset(table, c.pid)


def _counter(probes: Probes, idx: int) -> int:
    return sum(probes.bpf["counters"][ct.c_int(idx)])


RT, CU = call_id("cudaGraphLaunch"), call_id("cuGraphLaunch")


def test_streamed_graph_launches_count_exactly_once(probes, child):
    probes.set("http_active", child.pid, ct.c_int64(1))  # streamed, as during a request
    deduped = _counter(probes, CNT_DRIVER_DEDUPED)
    assert child.run("fooled") == [35, 0] * 3
    got = [(r.call, r.graph_exec, r.stream) for r in probes.of(child.pid) if isinstance(r, GraphCall)]
    assert got == [(RT, EXEC, STREAM), (CU, EXEC, STREAM)] * 3
    assert _counter(probes, CNT_DRIVER_DEDUPED) == deduped
    assert child.run("through") == [0] * 6
    got = [(r.call, r.graph_exec) for r in probes.of(child.pid) if isinstance(r, GraphCall)][6:]
    assert got == [(RT, EXEC), (CU, EXEC)] * 3
    assert _counter(probes, CNT_DRIVER_DEDUPED) == deduped + 3


def test_counted_graph_launches_are_exact_too(probes, child):
    """Outside requests (the in-kernel rollup): the same rule, the same counts."""
    child.run("fooled")
    child.run("through")
    counts = {key: n for key, (n, _bytes, _ns) in probes.rollup(child.pid).items()}
    assert counts == {(RT, EXEC): 6, (CU, EXEC): 6}
    assert [r for r in probes.of(child.pid) if isinstance(r, GraphCall)] == []


def test_graph_ops_arrive_with_their_stream_graph_and_exec(probes, child):
    """Sent always (not only during requests), runtime and driver alike; out-parameters
    read at return. The probe table's runtime graph ops are covered here."""
    r = child.run("ops")
    assert r["rets"] == [0] * 5 and r["graph"] and r["exec"]
    got = sorted((x for x in probes.of(child.pid) if isinstance(x, GraphOp)), key=lambda x: x.ts_ns)
    g, e = r["graph"], r["exec"]
    expected = [("cudaStreamBeginCapture", STREAM, 0, 0), ("cuStreamBeginCapture", STREAM, 0, 0),
                ("cudaStreamEndCapture", STREAM, g, 0), ("cuStreamEndCapture", STREAM, g, 0),
                ("cudaGraphInstantiate", 0, g, e), ("cuGraphInstantiate", 0, g, e),
                ("cudaGraphDestroy", 0, g, 0), ("cuGraphDestroy", 0, g, 0),
                ("cudaGraphExecDestroy", 0, 0, e), ("cuGraphExecDestroy", 0, 0, e)]
    assert [(x.call, x.stream, x.graph, x.graph_exec) for x in got] == [
        (call_id(n), *rest) for n, *rest in expected]
    assert {(x.ret, x.unreadable) for x in got} <= {(0, False), (-1, False)}  # destroys: entry only
    assert {n for n, *_ in expected} >= {c.name for c in CALLS if c.category is Category.GRAPH_OP}


def test_a_process_exiting_mid_capture_leaves_no_capture_state(probes, child):
    zero = ct.c_int(0)
    assert probes.bpf["captures_open"][zero].value == 0
    assert child.run("begin_capture") == [0]
    # The runtime's begin and the driver's under it: both counted, one process.
    assert probes.bpf["capture_procs"][ct.c_uint32(child.pid)].value > 0
    assert probes.bpf["captures_open"][zero].value > 0
    child.send("exit_now")
    child.proc.wait(10)
    deadline = time.monotonic() + 10  # the exit hook ran before wait() returned; slack for a loaded host
    while time.monotonic() < deadline and probes.bpf["captures_open"][zero].value:
        time.sleep(0.05)
    assert probes.bpf["captures_open"][zero].value == 0
    assert child.pid not in [k.value for k in probes.bpf["capture_procs"].keys()]
