"""A TLS record the SSL probes drop for want of a per-CPU scratch slot (all held: preempted
runs, bpf/maps.h scratch_claim) is lost to its connection as a ring-buffer loss is: it is
counted (scratch_busy), and the connection's next record says so (`lost`), so user space
drops what it had open there and the kernel's summary counts the request, instead of the
HTTP framing running on with bytes missing. The program is loaded directly
(tests/bpf/probe_harness.py) against the stdlib HTTPS server of tests/bpf/test_tls.py."""
from __future__ import annotations

import ctypes as ct
import socket
import sys
import time

from otel_gpu.cuda_calls import TLS
from otel_gpu.kernel_io.abi import CNT_SCRATCH_BUSY
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, SockIo
from tests.bpf.test_tls import client_context
from tests.harness import TARGETS, Target

TLS_SLOTS = range(0, 4)  # SCRATCH_TLS's slots in scratch_busy (bpf/maps.h)


def _libssl(pid: int) -> str:
    with open(f"/proc/{pid}/maps") as f:
        return next(line.split()[-1] for line in f if "libssl" in line.split()[-1])


def _ask(conn, n: int) -> None:
    """Request n on the keep-alive connection (no launches: one copy), its answer read whole."""
    conn.sendall(f"GET /infer?id={n}&launches=0 HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    want, got = f"ok {n}\n".encode(), b""
    while not got.endswith(want):
        chunk = conn.recv(65536)
        assert chunk, got
        got += chunk
    assert got.startswith(b"HTTP/1.1 200"), got[:40]


def _tls_records(probes, pid: int) -> list:
    time.sleep(0.2)
    return [r for r in probes.of(pid) if type(r) is SockIo and r.tls]


def test_a_tls_record_dropped_without_a_scratch_slot_is_told_as_lost_on_its_connection(probes, certificate):
    target = Target([sys.executable, str(TARGETS / "tls_servers.py"), "threaded", "0", *certificate])
    busy, counters = probes.bpf["scratch_busy"], probes.bpf["counters"]
    dropped = lambda: sum(counters[ct.c_int(CNT_SCRATCH_BUSY)])  # noqa: E731

    def hold(value: int) -> None:
        for i in TLS_SLOTS:
            busy[ct.c_int(i)] = busy.Leaf(*[value] * busy.total_cpu)

    try:
        probes.set("traced", target.pid, ct.c_uint32(1))
        assert probes.attach(TLS, _libssl(target.pid), target.pid) > 0
        target.go_raw()
        raw = socket.create_connection(("127.0.0.1", target.port), timeout=10)
        with client_context().wrap_socket(raw, server_hostname="127.0.0.1") as conn:
            _ask(conn, 1)
            first = _tls_records(probes, target.pid)  # the head's read, the answer's writes
            per = len(first)
            assert [r.kind for r in first] == [EV_SOCK_READ] + [EV_SOCK_WRITE] * (per - 1) and per >= 2
            assert first[0].data.startswith(b"GET /infer?id=1&") and not any(r.lost for r in first)
            before = dropped()
            hold(1)
            try:
                _ask(conn, 2)  # no slot: none of its records is written
                assert len(_tls_records(probes, target.pid)) == per
                assert dropped() - before == per
            finally:
                hold(0)
            _ask(conn, 3)
            third = _tls_records(probes, target.pid)[per:]
        assert [r.kind for r in third] == [r.kind for r in first]
        assert third[0].data.startswith(b"GET /infer?id=3&")
        assert third[0].lost == per and third[0].req_start  # the dropped ones, told; a new request begins
        assert not any(r.lost for r in third[1:])
    finally:
        target.stop()
