"""With --pid/--exe the CUDA and Python-context uprobes are attached for the selected
processes only: another process mapping the same libcudart (and interpreter) gets
no breakpoint, so it never traps and the BPF program never runs for it; a process
selected by --exe that starts later is probed when discovery finds it, counted
exactly, and its probes are detached when it exits; SIGTERM leaves none behind.

Real probes, the real libcudart (a private copy: its own inode, so probes other
tools put on the wheel's file are not in the way), real Python children. A
trace-everything collector run by someone else at the same time would probe the
copy too: each test first waits (bounded) until none runs, else it is skipped."""
from __future__ import annotations

import shutil
import sys
import time

import pytest

from bench import bpfstats
from bench.machine import foreign_tracers
from otel_gpu.cuda_calls import RUNTIME
from otel_gpu.probes.rows import rows_for
from tests.bpf.probe_harness import Child
from tests.bpf.targets.relia_support import cudart_path, lines_with, state, wait_until
from tests.bpf.test_probe_lifecycle import _our_uprobes, _probe_fds

# argv: libcudart path, the name to take (prctl PR_SET_NAME: what --exe matches).
# Hello: pid and where cudaLaunchKernel and PyContext_CopyCurrent are in its memory.
# Each line N: N launches on a worker thread, then N on the main thread.
CHILD = r'''
import ctypes as ct, json, os, sys, threading
ct.CDLL(None).prctl(15, sys.argv[2].encode()[:15], 0, 0, 0)
rt = ct.CDLL(sys.argv[1])
class Dim3(ct.Structure):
    _fields_ = [("x", ct.c_uint), ("y", ct.c_uint), ("z", ct.c_uint)]
rt.cudaLaunchKernel.argtypes = [ct.c_void_p, Dim3, Dim3, ct.c_void_p, ct.c_size_t, ct.c_void_p]
def launch(n):
    for _ in range(n):
        rt.cudaLaunchKernel(None, Dim3(3, 1, 1), Dim3(32, 1, 1), None, 0, None)
addr = lambda f: ct.cast(f, ct.c_void_p).value
print(json.dumps({"pid": os.getpid(), "launch_at": addr(rt.cudaLaunchKernel),
                  "copy_at": addr(ct.pythonapi.PyContext_CopyCurrent)}), flush=True)
for line in sys.stdin:
    t = threading.Thread(target=launch, args=(int(line),))
    t.start()
    t.join()
    launch(int(line))
    print(json.dumps({"launched": 2 * int(line)}), flush=True)
'''
LAUNCH_PROG = next(r.entry for r in rows_for(RUNTIME) if r.symbol == "cudaLaunchKernel")[:15]  # kernel cuts names


def _trace_everything_tracers() -> list[str]:
    """bpftrace runs and collectors without --pid/--exe that this test did not start:
    their probes are planted in every process mapping the file."""
    return [t for t in foreign_tracers() if "--pid" not in t and "--exe" not in t]


@pytest.fixture(autouse=True)
def no_trace_everything_tracer():
    deadline = time.monotonic() + 180
    while (busy := _trace_everything_tracers()) and time.monotonic() < deadline:
        time.sleep(2)
    if busy:
        pytest.skip(f"other tracers probe every process, ours too: {busy}")


def _child(lib: str, name: str) -> Child:
    return Child([sys.executable, "-c", CHILD, lib, name])


def _private_cudart(tmp_path) -> str:
    lib = tmp_path / "libcudart.so.12"
    shutil.copyfile(cudart_path(), lib)
    return str(lib)


def _breakpoint(child: Child, where: str) -> bool:
    """A uprobe is an int3 (0xcc) the kernel writes over the function's first byte
    in the memory of each process it applies to; no int3, no trap."""
    with open(f"/proc/{child.pid}/mem", "rb") as mem:
        mem.seek(child.hello[where])
        return mem.read(1) == b"\xcc"


def _launches(spans, pid: int) -> int:
    """CUDA launches counted for pid on its 'GPU work outside requests' spans."""
    return sum(s.attributes.get("gpu.launches", 0) for s in spans if s.parent_span_id == ""
               and s.attributes.get("process.pid") == pid and s.attributes.get("otel_gpu.attribution") == "outside")


def test_pid_probes_the_selected_process_only(tmp_path, receiver, start_collector):
    lib = _private_cudart(tmp_path)
    selected, neighbour = _child(lib, "pidscope_sel"), _child(lib, "pidscope_nb")
    try:
        collector = start_collector("--pid", str(selected.pid))
        collector.wait_traced(selected.pid)
        assert _breakpoint(selected, "launch_at") and _breakpoint(selected, "copy_at"), collector.log.lines
        others = _trace_everything_tracers()
        assert not _breakpoint(neighbour, "launch_at"), f"neighbour probed; other tracers running: {others}"
        assert not _breakpoint(neighbour, "copy_at"), f"neighbour's interpreter probed; other tracers: {others}"

        with bpfstats.enabled():  # per-program run counts of this collector's programs
            before = bpfstats.snapshot(collector.proc.pid)
            assert neighbour.run("500") == {"launched": 1000}
            assert selected.run("7") == {"launched": 14}
            ran = bpfstats.delta(before, bpfstats.snapshot(collector.proc.pid))
        runs = sum(n for name, n, _ in ran if name == LAUNCH_PROG)
        assert runs == 14, f"launch program ran {runs} times for 14 selected + 1000 neighbour launches: {ran}"

        assert receiver.wait_for(lambda s: _launches(s, selected.pid) >= 14), collector.log.lines[-20:]
        assert _launches(receiver.spans, selected.pid) == 14
        assert not [s for s in receiver.spans if s.attributes.get("process.pid") == neighbour.pid]
        assert lines_with(collector, f"for pid {selected.pid} only")
        assert not lines_with(collector, "cannot attach")

        assert collector.stop() == 0
        assert not _breakpoint(selected, "launch_at") and not _breakpoint(selected, "copy_at"), \
            f"breakpoints left after SIGTERM; other tracers: {_trace_everything_tracers()}"
        assert _our_uprobes(collector.proc.pid) == []
    finally:
        selected.stop()
        neighbour.stop()


def test_exe_probes_a_later_process_and_detaches_them_when_it_exits(tmp_path, receiver, start_collector):
    lib = _private_cudart(tmp_path)
    collector = start_collector("--exe", "pidscope_late")
    baseline, fds = state(collector, 20)["bpf.uprobes"], _probe_fds(collector.proc.pid)
    late = _child(lib, "pidscope_late")
    try:
        collector.wait_traced(late.pid)
        probes = state(collector, 20)["bpf.uprobes"] - baseline
        assert probes >= 4, f"{probes} probes for the new process"  # launch, memcpy, ..., interpreter
        assert _probe_fds(collector.proc.pid) == fds + probes
        assert _breakpoint(late, "launch_at")
        assert late.run("9") == {"launched": 18}
        assert receiver.wait_for(lambda s: _launches(s, late.pid) >= 18), collector.log.lines[-20:]
        assert _launches(receiver.spans, late.pid) == 18
    finally:
        late.stop()
    assert wait_until(lambda: state(collector, 20)["bpf.uprobes"] == baseline, 20), collector.log.lines[-20:]
    assert _probe_fds(collector.proc.pid) == fds
    assert lines_with(collector, f"detached {probes} CUDA probes of pid {late.pid}")
    assert collector.stop() == 0
    assert _our_uprobes(collector.proc.pid) == []
