"""Exact runtime/driver de-duplication, with the real probes in the real kernel: a
driver launch is dropped only when its caller is the process's CUDA runtime (the
return address lies in a libcudart mapping, written to `runtime_text` from the
child's own /proc/<pid>/maps by the collector's code). A stub libcudart that reaches
the stub libcuda (as the real one does on a GPU) is counted once; a driver launch from
another library (as cuBLAS makes them) with the same dims on the same thread right
after a runtime launch counts on its own: the old "same dims within 10 ms" rule
dropped it."""
from __future__ import annotations

import ctypes as ct
import sys

import pytest

from otel_gpu import proc
from otel_gpu.kernel_io.abi import CNT_DRIVER_CALLER_UNKNOWN, CNT_DRIVER_DEDUPED
from otel_gpu.records import LaunchCall
from otel_gpu.probes import runtime_text
from otel_gpu.probes.discovery import libraries_in_maps
from otel_gpu.cuda_calls import DRIVER, RUNTIME, call_id
from tests.bpf.probe_harness import Child, Probes, build_driver_stubs

# The child: the stub libcuda, a stub libcudart that reaches it, a library launching
# through the driver itself, and the real libcudart (which never reaches a driver here).
CHILD = r'''
import ctypes as ct, json, struct, sys
from otel_gpu.demo.cuda_work import find_cudart
drv, stub_rt, lib = (ct.CDLL(p) for p in sys.argv[1:4])
real_rt = ct.CDLL(find_cudart())
vp, u, size_t = ct.c_void_p, ct.c_uint, ct.c_size_t
class Dim3(ct.Structure):
    _fields_ = [("x", u), ("y", u), ("z", u)]
for rt in (stub_rt, real_rt):
    rt.cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, vp, size_t, vp]
    rt.cudaLaunchKernelExC.argtypes = [vp, vp, vp]
lib.stub_library_launch.argtypes = [vp] + [u] * 7
F, G, B, SHMEM = 0x1000, (6, 2, 1), (64, 2, 1), 128

def library(n):  # what cuBLAS does: its own cuLaunchKernel, same dims
    return [lib.stub_library_launch(F, *G, *B, SHMEM) for _ in range(n)]

def fooled():
    """A runtime launch that does not reach the exported cuLaunchKernel (the real
    libcudart here; on a GPU one reaching the driver by another entry), then a library's
    own driver launch with the same dims: two launches."""
    out = []
    for _ in range(3):
        out.append(real_rt.cudaLaunchKernel(F, Dim3(*G), Dim3(*B), None, SHMEM, None))
        out += library(1)
    return out

def through():
    """Runtime launches that reach cuLaunchKernel(Ex) from libcudart's code: once each;
    each followed by a library's own launch with the same dims: counted."""
    out = []
    cfg = ct.create_string_buffer(struct.pack("<6IQQQI4x", *G, *B, SHMEM, 0, 0, 0))
    for _ in range(3):
        out.append(stub_rt.cudaLaunchKernel(F, Dim3(*G), Dim3(*B), None, SHMEM, None))
        out += library(1)
    out.append(stub_rt.cudaLaunchKernelExC(cfg, F, None))
    return out

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    print(json.dumps(globals()[line.strip()]()), flush=True)
'''



@pytest.fixture
def child(probes, tmp_path):
    drv, stub_rt, lib = build_driver_stubs(tmp_path, "libcudart-stub.so")
    c = Child([sys.executable, "-c", CHILD, drv, stub_rt, lib])
    maps = proc.maps("/proc", c.pid)
    runtimes = {p for kind, p in libraries_in_maps(maps) if kind == RUNTIME}
    assert stub_rt in runtimes and len(runtimes) == 2, runtimes  # the stub and the real libcudart
    assert probes.attach(DRIVER, drv, c.pid) >= 2
    for path in runtimes:
        assert probes.attach(RUNTIME, path, c.pid) >= 2
    c.runtimes = runtimes
    yield c
    c.stop()
    for table in ("runtime_text", "http_active"):
        probes.unset(table, c.pid)


def _know_runtime(probes: Probes, c: Child) -> list:
    """What the collector does at its scan: the child's runtime code ranges, from its maps."""
    ranges = runtime_text.runtime_ranges(proc.maps("/proc", c.pid), c.runtimes)
    assert len(ranges) == 2, ranges  # one executable mapping per libcudart
    runtime_text.write(probes.bpf["runtime_text"], c.pid, ranges)
    return ranges


def _counter(probes: Probes, idx: int) -> int:
    return sum(probes.bpf["counters"][ct.c_int(idx)])


def _launches(probes: Probes, pid: int) -> list[tuple[str, tuple, tuple]]:
    return [(r.name, r.grid, r.block) for r in probes.of(pid) if isinstance(r, LaunchCall)]


RT, CU, CU_EX = "cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx"
DIMS = ((6, 2, 1), (64, 2, 1))


def test_streamed_launches_count_exactly_once(probes, child):
    _know_runtime(probes, child)
    probes.set("http_active", child.pid, ct.c_int64(1))  # streamed, as during a request
    deduped = _counter(probes, CNT_DRIVER_DEDUPED)
    assert child.run("fooled") == [35, 0] * 3  # the real runtime: no driver here
    assert _launches(probes, child.pid) == [(RT, *DIMS), (CU, *DIMS)] * 3
    assert _counter(probes, CNT_DRIVER_DEDUPED) == deduped
    assert child.run("through") == [0] * 7
    got = _launches(probes, child.pid)[6:]
    assert got == [(RT, *DIMS), (CU, *DIMS)] * 3 + [("cudaLaunchKernelExC", *DIMS)]
    assert _counter(probes, CNT_DRIVER_DEDUPED) == deduped + 4  # 3 cuLaunchKernel + 1 cuLaunchKernelEx


def test_counted_launches_are_exact_too(probes, child):
    """Outside requests (the in-kernel rollup): the same rule, the same counts."""
    _know_runtime(probes, child)
    child.run("fooled")
    child.run("through")
    counts = {}
    for (call, _detail), (n, _bytes, _ns) in probes.rollup(child.pid).items():
        counts[call] = counts.get(call, 0) + n
    assert counts == {call_id(RT): 6, call_id(CU): 6, call_id("cudaLaunchKernelExC"): 1}
    assert probes.of(child.pid) == []


def test_caller_unknown_until_the_runtime_ranges_are_written(probes, child):
    """Before the collector has read the process's maps, a driver launch counts and is
    counted as of an unknown caller (documented: runtime launches then count twice)."""
    probes.set("http_active", child.pid, ct.c_int64(1))
    unknown = _counter(probes, CNT_DRIVER_CALLER_UNKNOWN)
    child.run("through")
    assert [n for n, _, _ in _launches(probes, child.pid)] == [RT, CU, CU] * 3 + ["cudaLaunchKernelExC", CU_EX]
    assert _counter(probes, CNT_DRIVER_CALLER_UNKNOWN) == unknown + 7
    _know_runtime(probes, child)
    child.run("through")
    assert [n for n, _, _ in _launches(probes, child.pid)][11:] == [RT, CU] * 3 + ["cudaLaunchKernelExC"]
    assert _counter(probes, CNT_DRIVER_CALLER_UNKNOWN) == unknown + 7
