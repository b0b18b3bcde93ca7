"""Python execution context in the records (bpf/python_probes.c): every CUDA call and
socket read/write of a traced Python process carries `ctx`, the id() of the
contextvars.Context its thread runs, and every context copy made while the process
has HTTP activity arrives as ContextCopy(ctx, parent). Real interpreters (Debian's
stripped /usr/bin/python3.11, a pyenv 3.12 with libpython), found by
probes/discovery.py; the real libcudart (no GPU: calls return 35)."""
from __future__ import annotations

import ctypes as ct
import glob
import json
import os
import socket
import subprocess

import pytest

from otel_gpu.kernel_io.abi import PyProc, PyThreadKey
from otel_gpu.records import ContextCopy, CudaCall, LaunchCall, MemcpyCall, SockIo
from otel_gpu.probes import python
from otel_gpu.probes.discovery import Discovery
from otel_gpu.cuda_calls import PYTHON, RUNTIME
from otel_gpu.probes.rows import PYTHON_PROBES
from tests.bpf.probe_harness import Child

# Each command runs on the main thread inside OUTER, a context whose id() is known;
# every context whose id() is reported stays alive in KEEP (an id is an address:
# reused once the object is freed).
CHILD = r'''
import asyncio, contextvars, ctypes as ct, json, socket, sys, threading
rt = ct.CDLL(sys.argv[1])
class Dim3(ct.Structure):
    _fields_ = [("x", ct.c_uint), ("y", ct.c_uint), ("z", ct.c_uint)]
rt.cudaLaunchKernel.argtypes = [ct.c_void_p, Dim3, Dim3, ct.c_void_p, ct.c_size_t, ct.c_void_p]
rt.cudaMemcpy.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_size_t, ct.c_int]
host = ct.create_string_buffer(64)
LISTENER = socket.create_server(("127.0.0.1", 0))
KEEP = []

def cuda(tag):
    """A launch with grid.x = tag and a copy of tag bytes: the test finds them by tag."""
    rt.cudaLaunchKernel(None, Dim3(tag, 1, 1), Dim3(1, 1, 1), None, 0, None)
    rt.cudaMemcpy(host, host, tag, 1)
    return threading.get_native_id()

def reveal():
    """id() of a copy of the running context: the copy's record names the running
    context as its parent (before 3.12 a task's context has no other name)."""
    c = contextvars.copy_context()
    KEEP.append(c)
    return id(c)

def run():
    cuda(1)
    ctx = contextvars.copy_context()
    KEEP.append(ctx)
    ctx.run(cuda, 2)
    return {"ctx": id(ctx)}

async def in_task():
    cuda(3)
    t = asyncio.current_task()
    return {"task_ctx": id(t.get_context()) if hasattr(t, "get_context") else None, "task_reveal": reveal()}

def in_thread():
    return {"thread_tid": cuda(4), "thread_reveal": reveal()}

async def main():
    r = await asyncio.create_task(in_task())
    r.update(await asyncio.to_thread(in_thread))
    return r

def tasks():
    loop = asyncio.new_event_loop()
    main_ctx = contextvars.Context()
    KEEP.append(main_ctx)
    try:
        r = loop.run_until_complete(loop.create_task(main(), context=main_ctx))
    finally:
        loop.close()
    r["main_ctx"] = id(main_ctx)
    return r

def crowd():
    """run() on the main thread once 100 more threads exist: the main thread's state is
    the oldest, the last of the interpreter's thread list, past the probes' walk from
    its head (they find it where user space listed it)."""
    go = threading.Event()
    workers = [threading.Thread(target=go.wait) for _ in range(100)]
    for w in workers:
        w.start()
    try:
        return run()
    finally:
        go.set()
        for w in workers:
            w.join()

def serve():
    conn, _ = LISTENER.accept()
    conn.recv(4096)
    w = contextvars.copy_context()
    KEEP.append(w)
    w.run(conn.sendall, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")
    conn.close()
    return {"writer": id(w)}

def commands():
    print(json.dumps({"outer": id(OUTER), "tid": threading.get_native_id(),
                      "port": LISTENER.getsockname()[1]}), flush=True)
    for line in sys.stdin:
        print(json.dumps(globals()[line.strip()]()), flush=True)

OUTER = contextvars.Context()
OUTER.run(commands)
'''

# A CUDA process with no Python in it: one launch (grid.x = 7) per stdin line.
NATIVE = r'''
#include <dlfcn.h>
#include <stdio.h>
typedef struct { unsigned x, y, z; } dim3;
int main(int argc, char **argv)
{
    void *h = dlopen(argv[1], RTLD_NOW);
    int (*launch)(const void *, dim3, dim3, void **, size_t, void *) = h ? dlsym(h, "cudaLaunchKernel") : 0;
    if (!launch)
        return 1;
    char line[64];
    printf("{}\n");
    fflush(stdout);
    while (fgets(line, sizeof line, stdin)) {
        dim3 g = {7, 1, 1}, b = {1, 1, 1};
        launch((const void *)main, g, b, NULL, 0, NULL);
        printf("{}\n");
        fflush(stdout);
    }
    return 0;
}
'''


def _pyenv(minor: int):
    hits = sorted(glob.glob(f"/root/.pyenv/versions/3.{minor}.*/bin/python3"))
    return hits[-1] if hits else None


INTERPRETERS = {"debian-3.11-stripped": "/usr/bin/python3", "pyenv-3.12": _pyenv(12)}


@pytest.fixture(scope="module")
def cudart():
    from otel_gpu.demo.cuda_work import find_cudart
    return find_cudart()


@pytest.fixture
def start(probes, cudart):
    """start(interpreter, python_on=True, streaming=True): a child found by discovery, its
    CUDA library and interpreter probed; python_on: its tgid goes in py_procs;
    streaming: in http_active, as if it had served a request."""
    made = []

    def start_(interpreter: str, python_on: bool = True, streaming: bool = True) -> Child:
        c = Child([interpreter, "-c", CHILD, cudart])
        made.append(c)
        found = Discovery(pid_filter=lambda p: p == c.pid).scan()
        assert found.cuda_pids == {c.pid}
        (target,) = [t for t in found.targets if t.kind == PYTHON]
        assert probes.attach(PYTHON, target.path, c.pid) == len(PYTHON_PROBES)
        assert probes.attach(RUNTIME, cudart, c.pid) > 0
        probes.set("traced", c.pid, ct.c_uint32(1))
        if python_on:
            probes.set("py_procs", c.pid, PyProc.of(found.python[c.pid]))
            for thread, state in python.thread_states(f"/proc/{c.pid}/mem", found.python[c.pid]).items():
                probes.bpf["py_threads"][PyThreadKey(c.pid, 0, thread)] = ct.c_uint64(state)
        if streaming:
            probes.set("http_active", c.pid, ct.c_int64(1))
        c.python = found.python[c.pid]
        return c
    yield start_
    for c in made:
        c.stop()


@pytest.fixture(params=list(INTERPRETERS), ids=list(INTERPRETERS))
def interpreter(request):
    path = INTERPRETERS[request.param]
    if not path or not glob.glob(path):
        pytest.skip(f"{request.param}: no interpreter at {path}")
    return path


def tagged(recs: list, tag: int) -> list:
    """The CUDA records of cuda(tag): its launch and its copy."""
    out = [r for r in recs if (type(r) is LaunchCall and r.grid[0] == tag) or (type(r) is MemcpyCall and r.bytes == tag)]
    assert len(out) == 2, f"cuda({tag}) records: {out}"
    return out


def copy_of(recs: list, ctx: int, before: object = None) -> ContextCopy:
    """The latest ContextCopy that made `ctx` (before the record `before`)."""
    end = recs.index(before) if before is not None else len(recs)
    found = [r for r in recs[:end] if type(r) is ContextCopy and r.ctx == ctx]
    assert found, f"no ContextCopy made {ctx:#x}"
    return found[-1]


def test_interpreter_is_recognised(interpreter, start):
    c = start(interpreter)
    version = tuple(int(x) for x in subprocess.run(
        [interpreter, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True,
        check=True).stdout.split())
    assert c.python.layout == python.LAYOUTS[version]


def test_calls_carry_the_context_they_run_in(interpreter, start, probes):
    c = start(interpreter)
    outer = c.hello["outer"]
    r = c.run("run")
    recs = probes.of(c.pid)
    assert all(x.ctx == outer for x in tagged(recs, 1))
    assert all(x.ctx == r["ctx"] for x in tagged(recs, 2))
    made = copy_of(recs, r["ctx"])
    assert (made.tid, made.parent) == (c.pid, outer)


def test_a_thread_behind_a_hundred_newer_ones_is_found(interpreter, start, probes):
    c = start(interpreter)
    r = c.run("crowd")
    recs = probes.of(c.pid)
    assert all(x.ctx == c.hello["outer"] for x in tagged(recs, 1))
    assert all(x.ctx == r["ctx"] for x in tagged(recs, 2))


def test_asyncio_task_and_to_thread(interpreter, start, probes):
    c = start(interpreter)
    main_tid = c.hello["tid"]
    r = c.run("tasks")
    recs = probes.of(c.pid)
    # A task's calls carry the task's context: a copy of the creating task's context.
    task_calls = tagged(recs, 3)
    task_ctx = copy_of(recs, r["task_reveal"]).parent
    if r["task_ctx"] is not None:  # 3.12+ names it
        assert task_ctx == r["task_ctx"]
    assert all(x.ctx == task_ctx and x.tid == main_tid for x in task_calls)
    made = copy_of(recs, task_ctx, before=task_calls[0])
    assert (made.parent, made.tid) == (r["main_ctx"], main_tid)
    # asyncio.to_thread: the worker runs a copy made in the awaiting task, on the loop thread.
    thread_calls = tagged(recs, 4)
    reveal = copy_of(recs, r["thread_reveal"])
    thread_ctx = reveal.parent
    assert reveal.tid == r["thread_tid"] != main_tid
    assert all(x.ctx == thread_ctx and x.tid == r["thread_tid"] for x in thread_calls)
    made = copy_of(recs, thread_ctx, before=thread_calls[0])
    assert (made.parent, made.tid) == (r["main_ctx"], main_tid)


def test_socket_reads_and_writes_carry_the_context(interpreter, start, probes):
    c = start(interpreter, streaming=False)  # the request's read makes the process active
    c.send("serve")
    with socket.create_connection(("127.0.0.1", c.hello["port"]), timeout=10) as s:
        s.sendall(b"GET /x HTTP/1.1\r\nHost: t\r\n\r\n")
        assert s.recv(4096).startswith(b"HTTP/1.1 200")
    r = c.reply()
    io = [x for x in probes.of(c.pid) if type(x) is SockIo]
    assert [(x.kind, x.ctx) for x in io] == [(2, c.hello["outer"]), (3, r["writer"])]
    assert copy_of(probes.of(c.pid), r["writer"]).parent == c.hello["outer"]


def test_no_copies_streamed_without_http_activity(interpreter, start, probes):
    c = start(interpreter, streaming=False)
    c.run("run")
    c.run("tasks")
    assert probes.of(c.pid) == []  # CUDA calls are counted in `rollup`, copies are not sent


def test_a_process_not_in_py_procs_gets_no_context(interpreter, start, probes):
    c = start(interpreter, python_on=False)
    c.run("run")
    recs = probes.of(c.pid)
    assert [type(x) for x in recs if not isinstance(x, CudaCall)] == []
    assert len(recs) == 4 and all(x.ctx == 0 for x in recs)


def test_a_process_without_python_gets_no_context(probes, cudart, tmp_path):
    src, exe = tmp_path / "native.c", tmp_path / "native_cuda"
    src.write_text(NATIVE)
    subprocess.run(["gcc", "-o", str(exe), str(src), "-ldl"], check=True)
    c = Child([str(exe), cudart])
    try:
        found = Discovery(pid_filter=lambda p: p == c.pid).scan()
        assert found.cuda_pids == {c.pid} and found.python == {}
        assert [t for t in found.targets if t.kind == PYTHON] == []
        probes.attach(RUNTIME, cudart, c.pid)
        probes.set("http_active", c.pid, ct.c_int64(1))
        c.run("go")
        (rec,) = probes.of(c.pid)
        assert type(rec) is LaunchCall and rec.grid == (7, 1, 1) and rec.ctx == 0
    finally:
        c.stop()


THREADS_CHILD = r'''
import ctypes as ct, json, threading
ct.pythonapi.PyThreadState_Get.restype = ct.c_void_p
states, go, ready = {}, threading.Event(), threading.Barrier(9)
def note():
    states[threading.get_ident()] = ct.pythonapi.PyThreadState_Get()
def worker():
    note()
    ready.wait()
    go.wait()
workers = [threading.Thread(target=worker) for _ in range(8)]
for w in workers:
    w.start()
ready.wait()
note()
print(json.dumps(states), flush=True)
input()
go.set()
'''


def test_thread_states_lists_every_thread_of_the_interpreter(interpreter, tmp_path):
    """probes/python.py thread_states, what py_threads is filled from: read from another
    process's memory, the same states its threads get from the C API."""
    child = subprocess.Popen([interpreter, "-c", THREADS_CHILD], stdin=subprocess.PIPE, stdout=subprocess.PIPE,
                             text=True)
    try:
        states = {int(k): v for k, v in json.loads(child.stdout.readline()).items()}
        maps = open(f"/proc/{child.pid}/maps").read()
        path = python.libpython_in_maps(maps) or os.readlink(f"/proc/{child.pid}/exe")
        version = python.version_of_name(path) or python.exe_version(path, path)
        found = python.process(python.interpreter(path, version), maps, path)
        assert found is not None
        assert python.thread_states(f"/proc/{child.pid}/mem", found) == states  # 9 threads, all of them
        assert python.thread_states(f"/proc/{child.pid}/mem", found._replace(main_interp=8)) is None
    finally:
        child.communicate("\n", timeout=30)
