"""HTTP/2 by `Upgrade: h2c` (RFC 7540 3.2) through the real probes: hypercorn (PyPI)
answers an HTTP/1.1 upgrade request with 101 and the request as HTTP/2 stream 1; the
client (the `h2` package over a plain socket) then opens three more streams at once on
the same connection. One server span per request, the upgraded one included, with its
path and status; every request's CUDA calls under its own span (the upgraded one's
too: its app task writes its response HEADERS as HTTP/2), never under another's (the target and fixture of tests/bpf/test_http2.py)."""
from __future__ import annotations

import socket
import time

import h2.config
import h2.connection

from tests.bpf.test_http2 import h2_target, own_or_ambiguous  # noqa: F401 (h2_target: fixture)
from tests.harness import server_spans
from tests.support.h2_client import receive_all


def h2c_upgrade_get_all(port: int, first: str, paths: list[str], timeout: float = 30) -> dict:
    """GET `first` as an HTTP/1.1 upgrade to h2c, then every path as its own stream at
    once; returns {stream id: (path, status)} once all have ended."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    settings = conn.initiate_upgrade_connection()  # queues the preface for after the 101
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.sendall(f"GET {first} HTTP/1.1\r\nHost: 127.0.0.1:{port}\r\nConnection: Upgrade, HTTP2-Settings\r\n"
                 f"Upgrade: h2c\r\nHTTP2-Settings: ".encode() + settings + b"\r\n\r\n")
    buf, deadline = b"", time.monotonic() + timeout
    while b"\r\n\r\n" not in buf and time.monotonic() < deadline:
        data = sock.recv(65536)
        assert data, "connection closed before the 101"
        buf += data
    head, _, rest = buf.partition(b"\r\n\r\n")
    assert head.startswith(b"HTTP/1.1 101"), head[:40]
    streams = {1: [first, None]}
    for path in paths:
        sid = conn.get_next_available_stream_id()
        conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                (":authority", f"127.0.0.1:{port}")], end_stream=True)
        streams[sid] = [path, None]
    sock.sendall(conn.data_to_send())
    return receive_all(conn, sock, streams, deadline, rest)


def test_upgraded_request_and_three_concurrent_streams_each_get_their_span(h2_target, receiver):
    _, t = h2_target
    ids = [49, 50, 51]  # the upgraded request is 49; 50, 51 and a 404 follow as streams 3, 5, 7
    paths = [f"/infer?id={i}&launches=3" for i in ids] + ["/missing?id=99&launches=1"]
    got = h2c_upgrade_get_all(t.port, paths[0], paths[1:])
    assert got == {1: (paths[0], 200), 3: (paths[1], 200), 5: (paths[2], 200), 7: (paths[3], 404)}, got
    receiver.wait_for(lambda spans: len(server_spans(spans, t.pid)) >= 4, 40)
    receiver.wait_for(lambda spans: sum(1 for k in spans if k.resource.get("process.pid") == t.pid
                                        and k.name in ("cudaLaunchKernel", "cudaMemcpy")) >= 4 * len(ids), 30)
    time.sleep(1)  # a fifth span (a wrong one) would have come by now
    spans = list(receiver.spans)
    servers = server_spans(spans, t.pid)
    assert sorted((s.attributes["url.path"], s.attributes.get("http.response.status_code")) for s in servers) == [
        ("/infer", 200)] * len(ids) + [("/missing", 404)], [s.name for s in servers]
    assert len({s.attributes["client.port"] for s in servers}) == 1  # all on one connection
    for s in servers:
        assert s.attributes["network.protocol.version"] == "2" and s.name in ("GET /infer", "GET /missing")
        assert s.status_code != 2, s.name  # 2: ERROR (a request ended by a drop, not its response)
    exact = own_or_ambiguous(spans, servers, t.pid, ids)
    assert exact == len(ids), f"{exact} of {len(ids)} requests with exactly their calls"
