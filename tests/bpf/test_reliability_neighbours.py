"""A neighbour cannot evict our connections, and our own overflow is never silent.

The in-kernel connection table holds traced processes' connections only, and it is a
plain hash of --max-connections entries (here 512): an untraced, non-CUDA server with
three times as many idle connections leaves the traced service's old keep-alive
connections where they were, so their next requests get spans with exactly their CUDA
calls. The traced service's own connections beyond the table are counted
(connections_untracked), and the calls of their unseen requests land on windows
flagged otel_gpu.connections.untracked, never under a request. When every connection
has closed, the collector's tables (the SIGUSR1 "state:" line) are back at baseline."""
from __future__ import annotations

import http.client
import resource
import socket
import threading

from tests.bpf.targets.relia_support import state, stopped_counters, wait_until
from tests.harness import children_of, server_spans

TABLE = 512
NEIGHBOUR = 3 * TABLE  # idle connections to the untraced neighbour
OLD = 8                # the traced service's keep-alive connections from before the flood
EXTRA = 40             # the traced service's connections past the table
CONN_KEYS = ("bpf.conns", "conns", "conns_untracked", "open_requests")


def _raise_fd_limit(need: int) -> None:
    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    if soft < need:
        resource.setrlimit(resource.RLIMIT_NOFILE, (min(need, hard), hard))


class Neighbour:
    """An untraced TCP server (this test process maps no CUDA library and is not
    selected) holding every connection it accepts, idle."""

    def __init__(self) -> None:
        self.listener = socket.create_server(("127.0.0.1", 0), backlog=4096)
        self.accepted: list = []
        self.clients: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.accepted.append(self.listener.accept()[0])
            except OSError:
                return

    def flood(self, n: int) -> None:
        port = self.listener.getsockname()[1]
        self.clients += [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]
        assert wait_until(lambda: len(self.accepted) >= n, 20), f"{len(self.accepted)} of {n} accepted"

    def close(self) -> None:
        self.listener.close()
        for s in self.clients + self.accepted:
            s.close()


def _get(sock: socket.socket, path: str) -> None:
    sock.sendall(f"GET {path} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    reply = b""
    while not reply.endswith(b"\r\n\r\nok"):
        chunk = sock.recv(4096)
        assert chunk, f"connection closed mid-reply: {reply!r}"
        reply += chunk
    assert reply.startswith(b"HTTP/1.1 200"), reply


def _conn_tables(collector) -> dict:
    s = state(collector)
    return {k: s[k] for k in CONN_KEYS}


def test_neighbour_flood_and_own_overflow(receiver, start_collector, start_target):
    _raise_fd_limit(2 * NEIGHBOUR + 2 * (TABLE + EXTRA) + 512)
    target = start_target("asgi")  # task attribution: exact under overflow too
    target.go()
    collector = start_collector("--pid", str(target.pid), "--max-connections", str(TABLE))
    collector.wait_traced(target.pid)
    baseline = _conn_tables(collector)
    assert baseline["bpf.conns"] == 0 and baseline["conns_untracked"] == 0, baseline

    old = [http.client.HTTPConnection("127.0.0.1", target.port, timeout=20) for _ in range(OLD)]
    for c in old:
        c.request("GET", "/work?launches=1")
        assert c.getresponse().read() == b"ok"
    ports = {c.sock.getsockname()[1] for c in old}
    assert receiver.wait_for(lambda s: len(server_spans(s, target.pid)) >= OLD)

    neighbour = Neighbour()
    try:
        neighbour.flood(NEIGHBOUR)
        assert _conn_tables(collector)["bpf.conns"] == OLD  # none of the neighbour's went in
        for c in old:  # the old keep-alive connections still traced, exactly
            c.request("GET", "/work?launches=3&copies=2")
            assert c.getresponse().read() == b"ok"
            assert c.sock.getsockname()[1] in ports
    finally:
        neighbour.close()
    want = lambda s: [x for x in server_spans(s, target.pid) if x.attributes["gpu.launches"] == 3]  # noqa: E731
    assert receiver.wait_for(lambda s: len(want(s)) >= OLD), len(want(receiver.spans))

    own = [socket.create_connection(("127.0.0.1", target.port), timeout=20) for _ in range(TABLE - OLD + EXTRA)]
    try:
        full = {"bpf.conns": TABLE, "conns_untracked": EXTRA}
        assert wait_until(lambda: {k: _conn_tables(collector)[k] for k in full} == full, 20), \
            _conn_tables(collector)
        for s in own:  # each connection's request: 2 launches, seen or not
            _get(s, "/work?launches=2")
        own_ports = {s.getsockname()[1] for s in own}
        tracked = lambda spans: [x for x in server_spans(spans, target.pid)  # noqa: E731
                                 if x.attributes.get("client.port") in own_ports]
        assert receiver.wait_for(lambda s: len(tracked(s)) >= TABLE - OLD), len(tracked(receiver.spans))
    finally:
        for s in own:
            s.close()
    for c in old:
        c.close()
    # Tracked connections go with their close; untracked ones at the next audit (5 s flush).
    assert wait_until(lambda: _conn_tables(collector) == baseline, 30, 1), (_conn_tables(collector), baseline)
    assert collector.stop() == 0
    counters = stopped_counters(collector)
    spans = receiver.spans

    for span in want(spans):
        kids = children_of(spans, span)
        assert len(kids) == 5 and span.attributes["client.port"] in ports, span.attributes
        assert {k.attributes["otel_gpu.attribution"] for k in kids} == {"task"}
    assert len(want(spans)) == OLD

    seen = tracked(spans)
    assert len(seen) == TABLE - OLD  # no span for a request the kernel could not see
    for span in seen:
        assert span.attributes["gpu.launches"] == 2 and len(children_of(spans, span)) == 2, span.attributes
        assert {k.attributes["otel_gpu.attribution"] for k in children_of(spans, span)} == {"task"}
    # The unseen requests' calls: on windows that say connections were untracked.
    windows = [s for s in spans if not s.parent_span_id and s.attributes.get("process.pid") == target.pid
               and s.attributes.get("otel_gpu.attribution") in ("outside", "ambiguous")]
    assert sum(w.attributes.get("gpu.launches", 0) for w in windows) == 2 * EXTRA, \
        [w.attributes for w in windows]
    assert all(w.attributes.get("otel_gpu.connections.untracked", 0) >= 1
               for w in windows if w.attributes.get("gpu.launches")), [w.attributes for w in windows]
    assert counters.get("connections_untracked") == EXTRA, counters
