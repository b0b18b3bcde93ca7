"""A keep-alive connection opened before the collector started is traced from its next
request: the collector seeds it from /proc (the accept happened before us). The kernel
sees each read at its exit (bpf/http_syscalls.c), so a thread that was already blocked
in read() on that connection when we seeded it (a thread-per-connection server) has that
read, its next request, traced too, as an event loop's read after epoll is."""
from __future__ import annotations

import http.client

import pytest

from tests.harness import children_of, server_spans


@pytest.mark.parametrize("kind", ["stdlib", "asgi"])
def test_keep_alive_connection_from_before_the_collector(kind, receiver, start_collector, start_target):
    target = start_target(kind)
    target.go()
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=20)
    conn.request("GET", "/work?launches=1")
    assert conn.getresponse().read() is not None  # before the collector: not traced
    client_port = conn.sock.getsockname()[1]
    collector = start_collector()
    collector.wait_traced(target.pid)
    assert collector.log.wait_for(f"pid {target.pid}: ", 10), "".join(collector.log.lines)
    launches = [2, 3, 4, 5]
    for n in launches:
        conn.request("GET", f"/work?launches={n}&copies=1")
        conn.getresponse().read()
    assert conn.sock.getsockname()[1] == client_port  # the same connection throughout
    expected = launches
    assert receiver.wait_for(lambda spans: len(server_spans(spans, target.pid)) >= len(expected))
    collector.stop()
    spans = sorted(server_spans(receiver.spans, target.pid), key=lambda s: s.start_ns)
    assert [s.attributes["gpu.launches"] for s in spans] == expected
    for s in spans:
        assert s.attributes["client.port"] == client_port
        assert s.attributes["server.port"] == target.port
        kids = children_of(receiver.spans, s)
        assert len(kids) == s.attributes["gpu.launches"] + 1
        assert {k.attributes["otel_gpu.attribution"] for k in kids} <= {"thread", "task"}
    conn.close()
