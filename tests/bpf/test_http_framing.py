"""HTTP/1.x framing through the real socket probes: HTTP/1.0, keep-alive with many
requests on one connection, a request split across reads, pipelining."""
from __future__ import annotations

import socket
import time

from tests.harness import children_of, server_spans, traced


def _recv_responses(sock: socket.socket, n: int) -> bytes:
    data = b""
    deadline = time.monotonic() + 10
    while data.count(b"HTTP/1.") < n or not data.endswith(b"ok"):
        if time.monotonic() > deadline:
            raise TimeoutError(data)
        data += sock.recv(65536)
    return data


def _work_spans(receiver, pid, n):
    assert receiver.wait_for(lambda s: len([x for x in server_spans(s, pid) if x.attributes["http.route"] == "/work"]) >= n)
    return sorted([x for x in server_spans(receiver.spans, pid) if x.attributes["http.route"] == "/work"],
                  key=lambda s: s.start_ns)


def test_keep_alive_many_requests_on_one_connection(shared_collector, start_target):
    receiver, target = shared_collector.receiver, traced(shared_collector, start_target)
    with socket.create_connection(("127.0.0.1", target.port)) as s:
        for i in range(1, 6):
            s.sendall(f"GET /work?launches={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
            _recv_responses(s, 1)
    spans = _work_spans(receiver, target.pid, 5)
    assert [s.attributes["gpu.launches"] for s in spans] == [1, 2, 3, 4, 5]
    assert [len(children_of(receiver.spans, s)) for s in spans] == [1, 2, 3, 4, 5]
    assert len({s.attributes["client.port"] for s in spans}) == 1  # one connection


def test_http_1_0_and_a_request_split_across_reads(shared_collector, start_target):
    receiver, target = shared_collector.receiver, traced(shared_collector, start_target)
    with socket.create_connection(("127.0.0.1", target.port)) as s:
        s.sendall(b"GET /work?launches=2 HTTP/1.0\r\n\r\n")
        _recv_responses(s, 1)
    with socket.create_connection(("127.0.0.1", target.port)) as s:
        s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for piece in (b"GE", b"T /work?launc", b"hes=3 HTTP/1.1\r\nHo", b"st: x\r\n", b"\r\n"):
            s.sendall(piece)
            time.sleep(0.05)  # separate segments, separate reads
        _recv_responses(s, 1)
    first, second = _work_spans(receiver, target.pid, 2)
    assert first.attributes["network.protocol.version"] == "1.0" and first.attributes["gpu.launches"] == 2
    assert second.attributes["network.protocol.version"] == "1.1" and second.attributes["gpu.launches"] == 3
    assert second.attributes["url.path"] == "/work"


def test_pipelined_requests(shared_collector, start_target):
    receiver, target = shared_collector.receiver, traced(shared_collector, start_target)
    with socket.create_connection(("127.0.0.1", target.port)) as s:
        s.sendall(b"GET /work?launches=1 HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /work?launches=2 HTTP/1.1\r\nHost: x\r\n\r\n"
                  b"GET /work?launches=3 HTTP/1.1\r\nHost: x\r\n\r\n")
        _recv_responses(s, 3)
    spans = _work_spans(receiver, target.pid, 3)
    assert [s.attributes["gpu.launches"] for s in spans] == [1, 2, 3]
    assert all(s.attributes["http.response.status_code"] == 200 for s in spans)
