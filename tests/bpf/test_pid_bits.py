"""bpf/maps.h pid_bits, the inlined reads that let the syscall tracepoints skip
untraced processes and the launch probe count a process with no HTTP activity
without a hash lookup: what the kernel marks, when, and that the fast path counts
exactly what the full path would."""
from __future__ import annotations

import ctypes as ct
import socket
import sys
import time

from otel_gpu.records import LaunchCall
from otel_gpu.probes.pid_bits import SLOW, TRACED
from otel_gpu.cuda_calls import BY_NAME, RUNTIME
from tests.bpf.probe_harness import LAUNCH_CHILD_HEAD, Child, Probes

# Launches on demand; one HTTP request served on one connection, kept open until `close`.
CHILD = LAUNCH_CHILD_HEAD + r'''
listener = socket.socket()
listener.bind(("127.0.0.1", 0))
listener.listen(1)
conn = None
print(json.dumps({"cudart": path, "port": listener.getsockname()[1]}), flush=True)
for line in sys.stdin:
    cmd, *arg = line.split()
    if cmd == "launch":
        for _ in range(int(arg[0])):
            rt.cudaLaunchKernel(0x1000, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, None)
    elif cmd == "serve":
        conn, _ = listener.accept()
        conn.recv(4096)
    elif cmd == "close":
        conn.sendall(b"HTTP/1.1 200 OK\r\ncontent-length: 0\r\n\r\n")
        conn.close()
    print("{}", flush=True)
'''


def kernel_flags(probes: Probes, pid: int) -> int:
    word = probes.bpf["pid_bits"][ct.c_uint32(probes.pid_bits.words + pid // 32)].value
    return word >> 2 * (pid % 32) & 3


def launches_counted(probes: Probes, pid: int) -> int:
    call = BY_NAME["cudaLaunchKernel"].id
    return sum(n for (c, _detail), (n, _bytes, _ns) in probes.rollup(pid).items() if c == call)


def launches_streamed(probes: Probes, pid: int) -> int:
    return sum(isinstance(r, LaunchCall) for r in probes.of(pid))


def test_kernel_marks_traced_then_http_activity_and_clears_at_exit(probes):
    c = Child([sys.executable, "-c", CHILD])
    assert probes.attach(RUNTIME, c.hello["cudart"], c.pid) > 0
    assert kernel_flags(probes, c.pid) == 0
    c.run("launch 1000")  # the first launch traces it (TRACE_ALL), the rest take the fast path
    assert kernel_flags(probes, c.pid) == TRACED
    assert (launches_counted(probes, c.pid), launches_streamed(probes, c.pid)) == (1000, 0)

    client = socket.create_connection(("127.0.0.1", c.hello["port"]))
    client.sendall(b"GET /bits HTTP/1.1\r\nHost: x\r\n\r\n")
    c.run("serve")
    assert kernel_flags(probes, c.pid) == TRACED | SLOW
    c.run("launch 10")  # inside the request: streamed one by one, none counted twice
    assert (launches_counted(probes, c.pid), launches_streamed(probes, c.pid)) == (1000, 10)

    c.run("close")
    client.close()
    c.run("launch 20")  # SLOW stays (sticky): the full path, which counts them as before
    assert kernel_flags(probes, c.pid) == TRACED | SLOW
    assert (launches_counted(probes, c.pid), launches_streamed(probes, c.pid)) == (1020, 10)

    c.stop()
    deadline = time.monotonic() + 10
    while kernel_flags(probes, c.pid) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert kernel_flags(probes, c.pid) == 0  # the pid may be reused


def test_user_space_slow_bit_routes_a_follower_to_the_full_path(probes):
    """A follower of an active server streams although it has no HTTP activity of its
    own: user space's SLOW bit keeps it off the fast path."""
    c = Child([sys.executable, "-c", CHILD])
    server = Child([sys.executable, "-c", "import json; print(json.dumps({}), flush=True); input()"])
    try:
        assert probes.attach(RUNTIME, c.hello["cudart"], c.pid) > 0
        c.run("launch 5")
        assert (launches_counted(probes, c.pid), launches_streamed(probes, c.pid)) == (5, 0)
        probes.set("http_active", server.pid, ct.c_int64(1))
        probes.set("traced", c.pid, ct.c_uint32(server.pid))  # follows the server
        c.run("launch 7")
        assert (launches_counted(probes, c.pid), launches_streamed(probes, c.pid)) == (5, 7)
        probes.set("traced", c.pid, ct.c_uint32(TRACED))  # follows no one again: fast path
        c.run("launch 3")
        assert (launches_counted(probes, c.pid), launches_streamed(probes, c.pid)) == (8, 7)
    finally:
        probes.unset("http_active", server.pid)
        server.proc.kill()
        c.stop()
