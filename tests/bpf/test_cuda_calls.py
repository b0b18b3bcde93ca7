"""Each CUDA probe against the real libcudart (no GPU: every call returns 35, and the
probes see the real arguments): the BPF program loaded directly, uprobes attached
from cuda_calls.py to one child process, which makes the calls through ctypes.
While the child counts as having HTTP activity each call arrives as its typed record
with its arguments; otherwise it lands in the per-CPU `rollup` map under the detail
cuda_calls.py ROLLUP_DETAIL names for its category."""
from __future__ import annotations

import ctypes as ct
import dataclasses
import subprocess
import sys

import pytest

from otel_gpu.kernel_io.abi import CNT_DRIVER_DEDUPED
from otel_gpu.records import DeviceCall, GraphCall, LaunchCall, MemcpyCall, MemoryCall, SyncCall
from otel_gpu.cuda_calls import CALLS, DRIVER, RUNTIME, BY_NAME, Category
from tests.bpf.probe_harness import Child, Probes
from tests.harness import TARGETS

# The child: loads libcudart (and a stub libcuda when given), then runs one named
# batch of calls per stdin line and prints what it passed and got back as JSON.
CHILD = r'''
import ctypes as ct, json, struct, sys
from otel_gpu.demo.cuda_work import find_cudart
path = find_cudart()
rt = ct.CDLL(path)
drv = ct.CDLL(sys.argv[1]) if len(sys.argv) > 1 else None
vp, u, size_t = ct.c_void_p, ct.c_uint, ct.c_size_t
class Dim3(ct.Structure):
    _fields_ = [("x", u), ("y", u), ("z", u)]
rt.cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, vp, size_t, vp]
rt.cudaLaunchKernelExC.argtypes = [vp, vp, vp]
rt.cudaMemcpy.argtypes = [vp, vp, size_t, ct.c_int]
rt.cudaMemcpyAsync.argtypes = [vp, vp, size_t, ct.c_int, vp]
rt.cudaMalloc.argtypes = [ct.POINTER(vp), size_t]
for name in ("cudaFree", "cudaStreamSynchronize", "cudaEventSynchronize"):
    getattr(rt, name).argtypes = [vp]
rt.cudaSetDevice.argtypes = [ct.c_int]
rt.cudaGraphLaunch.argtypes = [vp, vp]
rt.cudaMemcpy2DAsync.argtypes = [vp, size_t, vp, size_t, size_t, size_t, ct.c_int, vp]
host = ct.create_string_buffer(4096)
# Any code address stands for a kernel: without a driver the runtime never runs it.
f = ct.cast(ct.CDLL(None).getpid, vp).value

def runtime():
    r = {"func": f, "launch": rt.cudaLaunchKernel(f, Dim3(4, 2, 1), Dim3(64, 2, 1), None, 128, 0x5000)}
    # cudaLaunchConfig_t: dim3 grid, block; size_t dynamicSmemBytes; stream; attrs; numAttrs
    cfg = ct.create_string_buffer(struct.pack("<6IQQQI4x", 3, 1, 1, 32, 1, 1, 256, 0x6000, 0, 0))
    r["exc"] = rt.cudaLaunchKernelExC(cfg, f, None)
    r["memcpy"] = rt.cudaMemcpy(host, host, 1000, 1)
    r["memcpy_async"] = rt.cudaMemcpyAsync(host, host, 2000, 2, 0x7000)
    p = vp(0xabc000)
    r["malloc"] = rt.cudaMalloc(ct.byref(p), 1 << 20)
    r["ptr"] = p.value or 0
    r["free"] = rt.cudaFree(0xdead000)
    r["stream_sync"] = rt.cudaStreamSynchronize(0x8000)
    r["device_sync"] = rt.cudaDeviceSynchronize()
    r["event_sync"] = rt.cudaEventSynchronize(0x9000)
    r["set_device"] = rt.cudaSetDevice(1)
    r["graph"] = rt.cudaGraphLaunch(0xa000, 0xb000)
    r["memcpy_2d_async"] = rt.cudaMemcpy2DAsync(host, 64, host, 64, 48, 10, 3, 0xe000)
    return r

def driver():
    drv.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]
    drv.cuLaunchKernelEx.argtypes = [vp, vp, vp, vp]
    r = {"func": f, "cu": drv.cuLaunchKernel(f, 7, 3, 1, 128, 2, 1, 256, 0xc000, None, None)}
    # CUlaunchConfig: u32 dims, u32 sharedMemBytes, 4 bytes padding (junk here), hStream
    raw = struct.pack("<7I", 5, 1, 1, 64, 1, 1, 512) + b"\xff" * 4 + struct.pack("<QQI4x", 0xd000, 0, 0)
    r["cu_ex"] = drv.cuLaunchKernelEx(ct.create_string_buffer(raw), f, None, None)
    return r

print(json.dumps({"cudart": path}), flush=True)
for line in sys.stdin:
    print(json.dumps(globals()[line.strip()]()), flush=True)
'''


class CudaProbes(Probes):
    """The shared harness, plus the maps these tests turn and read."""

    def streaming(self, pid: int, on: bool) -> None:
        if on:
            self.set("http_active", pid, ct.c_int64(1))
        else:
            self.unset("http_active", pid)

    def counter(self, idx: int) -> int:
        return sum(self.bpf["counters"][ct.c_int(idx)])


@pytest.fixture(scope="module")
def probes():
    p = CudaProbes()
    yield p
    p.close()


@pytest.fixture
def child(probes):
    made = []

    def start(stub: str | None = None) -> Child:
        c = Child([sys.executable, "-c", CHILD, *([stub] if stub else [])])
        made.append(c)
        probes.attach(RUNTIME, c.hello["cudart"], c.pid)
        if stub:
            probes.attach(DRIVER, stub, c.pid)
        return c
    yield start
    for c in made:
        c.stop()


def stable(record):
    """A record without what the test cannot know in advance (time, durations)."""
    d = dataclasses.asdict(record)
    d.pop("ts_ns")
    d.pop("duration_ns", None)
    return type(record).__name__, d


def runtime_expectations(pid: int, r: dict) -> dict:
    """API name -> (streamed record, rollup (detail, bytes), has a duration)."""
    f, h = r["func"], (pid, pid, 0)
    return {
        "cudaLaunchKernel": (LaunchCall(*h, 1, -1, f, (4, 2, 1), (64, 2, 1), 128, 0x5000), (f, 0), False),
        "cudaLaunchKernelExC": (LaunchCall(*h, 2, -1, f, (3, 1, 1), (32, 1, 1), 256, 0x6000), (f, 0), False),
        "cudaMemcpy": (MemcpyCall(*h, 3, -1, 1000, 1, 0), (1, 1000), False),
        "cudaMemcpyAsync": (MemcpyCall(*h, 4, -1, 2000, 2, 0x7000), (2, 2000), False),
        "cudaMalloc": (MemoryCall(*h, 5, r["malloc"], r["ptr"], 1 << 20, 0), (r["ptr"], 1 << 20), True),
        "cudaFree": (MemoryCall(*h, 6, -1, 0xdead000, 0, 0), (0xdead000, 0), False),
        "cudaStreamSynchronize": (SyncCall(*h, 7, r["stream_sync"], 0x8000, 0), (0, 0), True),
        "cudaDeviceSynchronize": (SyncCall(*h, 8, r["device_sync"], 0, 0), (0, 0), True),
        "cudaEventSynchronize": (SyncCall(*h, 9, r["event_sync"], 0x9000, 0), (0, 0), True),
        "cudaSetDevice": (DeviceCall(*h, 13, -1, 1), (1, 0), False),
        "cudaGraphLaunch": (GraphCall(*h, 10, -1, 0xa000, 0xb000), (0xa000, 0), False),
        "cudaMemcpy2DAsync": (MemcpyCall(*h, 14, -1, 48 * 10, 3, 0xe000), (3, 480), False),
    }


def test_every_runtime_call_is_covered_here():
    """A new row for libcudart needs its case in runtime_expectations (the calls that
    hand out kernel handles: tests/bpf/test_kernel_names.py; graph ops:
    tests/bpf/test_graph_probes.py)."""
    names = {c.name for c in CALLS if c.library == RUNTIME and c.category not in (Category.NAME, Category.GRAPH_OP)}
    assert names == set(runtime_expectations(0, {"func": 0, "malloc": 0, "ptr": 0, "stream_sync": 0,
                                                  "device_sync": 0, "event_sync": 0}))


def test_streamed_calls_arrive_as_typed_records(probes, child):
    c = child()
    probes.streaming(c.pid, True)
    r = c.run("runtime")
    want = runtime_expectations(c.pid, r)
    got = probes.of(c.pid)
    assert [stable(x) for x in got] == [stable(w) for w, _, _ in want.values()]
    for rec, (_, _, timed) in zip(got, want.values()):
        assert rec.call == BY_NAME[rec.name].id
        assert (rec.duration_ns > 0) == timed if hasattr(rec, "duration_ns") else not timed, rec
    assert r["malloc"] == 35  # no driver: the return probe saw the real return code
    assert probes.rollup(c.pid) == {}


def test_calls_outside_requests_are_rolled_up_by_detail(probes, child):
    c = child()
    r = c.run("runtime")
    r2 = c.run("runtime")  # twice: counts and bytes add up
    assert r2["ptr"] == r["ptr"]
    want = runtime_expectations(c.pid, r)
    got = probes.rollup(c.pid)
    assert probes.of(c.pid) == []
    expected = {(BY_NAME[name].id, detail): [2, 2 * nbytes] for name, (_, (detail, nbytes), _) in want.items()}
    assert {k: v[:2] for k, v in got.items()} == expected
    for name, (_, (detail, _), timed) in want.items():
        assert (got[(BY_NAME[name].id, detail)][2] > 0) == timed, name
    # Each detail is what ROLLUP_DETAIL promises for the category.
    by_category = {Category.LAUNCH: r["func"], Category.GRAPH: 0xa000, Category.ALLOC: r["ptr"],
                   Category.FREE: 0xdead000, Category.SYNC: 0, Category.DEVICE: 1}
    for name, (_, (detail, _), _) in want.items():
        cat = BY_NAME[name].category
        if cat != Category.MEMCPY:  # the direction: 1 and 2 above
            assert detail == by_category[cat], name


def _stub_libcuda(tmp_path) -> str:
    lib = tmp_path / "libcuda.so.1"
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(lib), str(TARGETS / "stub_libcuda.c")], check=True)
    return str(lib)


def test_driver_launches(probes, child, tmp_path):
    """Called from here, not from a libcudart: launches of their own (the de-duplication
    of runtime launches passing through the driver: tests/bpf/test_driver_dedup.py)."""
    c = child(_stub_libcuda(tmp_path))
    deduped = probes.counter(CNT_DRIVER_DEDUPED)
    probes.streaming(c.pid, True)
    r = c.run("driver")
    f, h = r["func"], (c.pid, c.pid, 0)
    assert [stable(x) for x in probes.of(c.pid)] == [stable(x) for x in (
        LaunchCall(*h, 11, -1, f, (7, 3, 1), (128, 2, 1), 256, 0xc000),
        LaunchCall(*h, 12, -1, f, (5, 1, 1), (64, 1, 1), 512, 0xd000),  # u32 shared memory: junk ignored
    )]
    probes.streaming(c.pid, False)
    c.run("driver")
    assert {k: v[0] for k, v in probes.rollup(c.pid).items()} == {(11, f): 1, (12, f): 1}
    assert probes.counter(CNT_DRIVER_DEDUPED) == deduped
