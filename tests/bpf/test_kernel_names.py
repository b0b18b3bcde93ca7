"""Kernel names for every launch path, with the real probes in the real kernel: a
child process calls the handle-giving entry points of stub libraries (a stub
libcuda.so.1, a stub CUDA 13 runtime handing out opaque cudaKernel_t handles, as on a
GPU) and of the real libcudart 13.0 where it exists, then launches by handle. What
the probes send goes through the collector's own decoder and namer (KernelNames,
symbolising the live child), and each launch must come out with its kernel's name."""
from __future__ import annotations

import ctypes as ct
import sys
from pathlib import Path

import pytest

from otel_gpu.records import KernelHandle, LaunchCall
from otel_gpu.enrich.symbols import KernelNames
from otel_gpu.cuda_calls import DRIVER, RUNTIME, call_id
from tests.bpf.probe_harness import Child, Probes, build_stub
from tests.harness import TARGETS, Target, children_of, server_spans

CUDART13 = Path("/usr/local/cuda-13.0/lib/libcudart.so.13")

# The child: loads the libraries named on its command line, then runs one named
# batch of calls per stdin line and prints the handles and return codes as JSON.
CHILD = r'''
import ctypes as ct, json, sys
drv = ct.CDLL(sys.argv[1])
rt = ct.CDLL(sys.argv[2])
vp, u, size_t = ct.c_void_p, ct.c_uint, ct.c_size_t
class Dim3(ct.Structure):
    _fields_ = [("x", u), ("y", u), ("z", u)]
drv.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
for name in ("cuModuleGetFunction", "cuLibraryGetKernel"):
    getattr(drv, name).argtypes = [ct.POINTER(vp), vp, ct.c_char_p]
drv.cuKernelGetFunction.argtypes = [ct.POINTER(vp), vp]
for name in ("__cudaLaunchKernel", "__cudaLaunchKernel_ptsz"):
    getattr(rt, name).argtypes = [vp, Dim3, Dim3, vp, size_t, vp]
for name in ("__cudaGetKernel", "cudaGetKernel"):
    if hasattr(rt, name):
        getattr(rt, name).argtypes = [ct.POINTER(vp), vp]

def get(fn, *args):
    h = vp(0)
    ret = fn(ct.byref(h), *args)
    return ret, h.value or 0

def launch(h, grid):
    return drv.cuLaunchKernel(h, grid, 1, 1, 32, 1, 1, 0, None, None, None)

def driver():
    r = {}
    # First an unreadable name: its record says so, and the next ones must not inherit it.
    r["bad_ret"], _ = get(drv.cuModuleGetFunction, 0x10, ct.cast(0x10, ct.c_char_p))
    r["module_ret"], r["function"] = get(drv.cuModuleGetFunction, 0x10, b"_Z9my_kernelPf")
    r["library_ret"], r["kernel"] = get(drv.cuLibraryGetKernel, 0x20, b"triton_poi_fused_add_0")
    r["kfunc_ret"], r["kernel_function"] = get(drv.cuKernelGetFunction, vp(r["kernel"]))
    r["missing_ret"], r["missing"] = get(drv.cuModuleGetFunction, 0x10, b"missing_kernel")
    r["unknown"] = 0x7f0000abc000  # a handle no probed call handed out
    for i, key in enumerate(("function", "kernel", "kernel_function", "unknown")):
        launch(r[key], i + 1)  # grid.x tells the launches apart
    return r

def runtime():
    """The CUDA 13 <<<>>> path: a handle for the host stub once, then launches by handle."""
    # The stub runtime has nvcc's host stub for vec_add; the real one has none: any code stands in.
    host = rt._Z7vec_addPfi if hasattr(rt, "_Z7vec_addPfi") else drv.cuLaunchKernel
    stub = ct.cast(host, vp).value
    r = {"stub": stub}
    r["get_ret"], r["handle"] = get(getattr(rt, "__cudaGetKernel"), vp(stub))
    h = vp(r["handle"])
    r["launch_ret"] = getattr(rt, "__cudaLaunchKernel")(h, Dim3(5, 1, 1), Dim3(64, 1, 1), None, 0, None)
    r["ptsz_ret"] = getattr(rt, "__cudaLaunchKernel_ptsz")(h, Dim3(6, 1, 1), Dim3(64, 1, 1), None, 0, None)
    if hasattr(rt, "cudaGetKernel"):
        r["public_ret"], r["public_handle"] = get(rt.cudaGetKernel, vp(stub))
    return r

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    print(json.dumps(globals()[line.strip()]()), flush=True)
'''



@pytest.fixture
def child(probes, tmp_path):
    made = []

    def start(cudart: str) -> Child:
        drv = build_stub(tmp_path, "stub_libcuda.c", "libcuda.so.1")
        c = Child([sys.executable, "-c", CHILD, drv, cudart])
        made.append(c)
        assert probes.attach(DRIVER, drv, c.pid) >= 4  # cuLaunchKernel(Ex) and the three handle calls
        probes.attach(RUNTIME, cudart, c.pid)
        probes.set("http_active", c.pid, ct.c_int64(1))  # launches stream as during a request
        return c
    yield start
    for c in made:
        c.stop()


def _records(probes: Probes, pid: int):
    got = probes.of(pid)
    return [r for r in got if isinstance(r, KernelHandle)], [r for r in got if isinstance(r, LaunchCall)]


def _named(pid: int, handles, launches) -> dict:
    """grid.x -> the name the collector's namer gives each launch."""
    names = KernelNames()
    for h in handles:
        names.learn(h)
    try:
        return {launch.grid[0]: names(pid, launch.func) for launch in launches}
    finally:
        names.forget(pid)


def test_driver_handles_are_named_through_the_calls_that_handed_them_out(probes, child, tmp_path):
    c = child(build_stub(tmp_path, "stub_cudart13.c", "libcudart.so.13"))
    r = c.run("driver")
    assert r["module_ret"] == r["library_ret"] == r["kfunc_ret"] == 0 and r["missing_ret"] == 500
    handles, launches = _records(probes, c.pid)
    by_call = {(h.call, h.handle): h for h in handles}
    fn = by_call[(call_id("cuModuleGetFunction"), r["function"])]
    assert (fn.name, fn.source, fn.ret, fn.cut, fn.unreadable) == ("_Z9my_kernelPf", 0, 0, False, False)
    assert by_call[(call_id("cuLibraryGetKernel"), r["kernel"])].name == "triton_poi_fused_add_0"
    kf = by_call[(call_id("cuKernelGetFunction"), r["kernel_function"])]
    assert (kf.source, kf.name) == (r["kernel"], None)
    bad = [h for h in handles if h.ret == 1]
    assert r["bad_ret"] == 1 and len(bad) == 1 and bad[0].unreadable and bad[0].name is None
    assert [h.unreadable for h in handles if h.ret != 1] == [False] * 4
    missing = [h for h in handles if h.ret == 500]
    assert len(missing) == 1 and missing[0].name == "missing_kernel"  # sent, and learns nothing
    assert [x.func for x in launches] == [r["function"], r["kernel"], r["kernel_function"], r["unknown"]]
    assert _named(c.pid, handles, launches) == {
        1: "my_kernel(float*)",             # CUfunction from cuModuleGetFunction, demangled
        2: "triton_poi_fused_add_0",        # a CUkernel passed straight to cuLaunchKernel
        3: "triton_poi_fused_add_0",        # CUfunction <- cuKernelGetFunction <- CUkernel
        4: None,                            # unknown: spans keep 0x7f0000abc000
    }


def test_cuda13_opaque_handles_are_named_by_their_host_stub(probes, child, tmp_path):
    c = child(build_stub(tmp_path, "stub_cudart13.c", "libcudart.so.13"))
    r = c.run("runtime")
    assert r["get_ret"] == 0 and r["handle"] not in (0, r["stub"])  # opaque, as on a GPU
    handles, launches = _records(probes, c.pid)
    got = [h for h in handles if h.call == call_id("__cudaGetKernel")]
    assert [(h.handle, h.source, h.name) for h in got] == [(r["handle"], r["stub"], None)]
    # __cudaLaunchKernel(_ptsz) reach the exported cudaLaunchKernel: one launch each.
    assert [(x.call, x.func, x.grid[0]) for x in launches] == [
        (call_id("cudaLaunchKernel"), r["handle"], 5), (call_id("cudaLaunchKernel"), r["handle"], 6)]
    assert _named(c.pid, handles, launches) == {5: "vec_add(float*, int)", 6: "vec_add(float*, int)"}
    assert _named(c.pid, [], launches) == {5: None, 6: None}  # without the handle: 0x... (the issue)


def _real_cudarts() -> list:
    from otel_gpu.demo.cuda_work import find_cudart
    return [pytest.param(str(CUDART13), 35, id="cuda13",
                         marks=pytest.mark.skipif(not CUDART13.exists(), reason="no CUDA 13 toolkit")),
            pytest.param(find_cudart(), 0, id="wheel")]


@pytest.mark.parametrize("cudart,get_ret", _real_cudarts())
def test_real_cudart_without_a_gpu(probes, child, cudart, get_ret):
    """The real libcudart, no driver: __cudaGetKernel writes the host stub to the handle
    (13.0 then fails with 35, insufficient driver; the 12.x wheel returns 0: its handle
    is the host stub); the launch reaches cudaLaunchKernel with the host stub, which
    names itself. Nothing wrong is learned from either."""
    c = child(cudart)
    r = c.run("runtime")
    assert r["get_ret"] == get_ret and r["handle"] == r["stub"]
    assert r["launch_ret"] == 35 and r["public_ret"] == 35
    handles, launches = _records(probes, c.pid)
    assert {(h.call, h.ret, h.handle, h.source) for h in handles} >= {
        (call_id("__cudaGetKernel"), get_ret, r["stub"], r["stub"])}
    assert [(x.call, x.func) for x in launches][:2] == [(call_id("cudaLaunchKernel"), r["stub"])] * 2
    named = _named(c.pid, handles, launches)
    assert named[5] == named[6] and named[5] and named[5].startswith("cuLaunchKernel")


def test_the_collector_names_handle_launches_in_spans(tmp_path, receiver, start_collector):
    """End to end: `otel-gpu run` discovers the stub libraries, learns the handles
    and names each launch's span; the unknown handle keeps its honest 0x... only."""
    env = {"STUB_LIBCUDA": build_stub(tmp_path, "stub_libcuda.c", "libcuda.so.1"),
           "STUB_CUDART13": build_stub(tmp_path, "stub_cudart13.c", "libcudart.so.13")}
    collector = start_collector()
    target = Target([sys.executable, str(TARGETS / "handle_http.py")], env)
    try:
        collector.wait_traced(target.pid)
        # Both libraries' probes, which a scan may attach one at a time (it can find the
        # process between its two loads); a library's file-wide line comes after its
        # per-process launch probes (probes/launch_routes.py).
        for name, path in env.items():
            assert collector.log.wait_for(f"probes to /proc/{target.pid}/root{path}\n", 10), f"{name} not probed"
        target.go()
        target.get("/launch")
        assert receiver.wait_for(lambda s: any(x.attributes.get("http.route") == "/launch"
                                               for x in server_spans(s, target.pid)))
        span = next(x for x in server_spans(receiver.spans, target.pid) if x.attributes.get("http.route") == "/launch")
        kids = {k.attributes["gpu.grid"][0]: k for k in children_of(receiver.spans, span)}
        assert {g: k.attributes.get("gpu.kernel.name") for g, k in kids.items()} == {
            1: "my_kernel(float*)", 2: "triton_poi_fused_add_0", 3: "triton_poi_fused_add_0", 4: None,
            5: "vec_add(float*, int)"}, collector.log.lines
        assert kids[4].attributes["gpu.kernel.func"] == hex(0x7F0000ABC000)
        assert [kids[g].name for g in range(1, 6)] == ["cuLaunchKernel"] * 4 + ["cudaLaunchKernel"]
    finally:
        target.stop()


def test_handle_records_need_a_free_scratch_slot_and_are_counted_without_one(probes, child, tmp_path):
    """The handle returns are uprobes, which a preemptible kernel can preempt mid-record:
    each takes a per-CPU scratch slot by compare-and-swap (bpf/maps.h scratch_claim).
    With every slot held (as by preempted runs), no record is written over one in use:
    each is dropped and counted in scratch_busy; freed again, they flow."""
    from otel_gpu.kernel_io.abi import CNT_SCRATCH_BUSY
    busy, counters = probes.bpf["scratch_busy"], probes.bpf["counters"]
    first = 4  # SCRATCH_HANDLES (bpf/maps.h): the handle slots follow the 4 TLS ones
    dropped = lambda: sum(counters[ct.c_int(CNT_SCRATCH_BUSY)])  # noqa: E731

    def hold(value: int) -> None:
        for i in range(first, first + 4):
            busy[ct.c_int(i)] = busy.Leaf(*[value] * busy.total_cpu)

    c = child(build_stub(tmp_path, "stub_cudart13.c", "libcudart.so.13"))
    before = dropped()
    hold(1)
    try:
        c.run("driver")
        handles, launches = _records(probes, c.pid)
        assert handles == [] and len(launches) == 4
        assert dropped() - before == 5  # the five handle calls' returns
    finally:
        hold(0)
    c.run("driver")
    handles, _ = _records(probes, c.pid)
    assert len(handles) == 5 and dropped() - before == 5
