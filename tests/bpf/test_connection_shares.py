"""A related listener's flood cannot starve the GPU service of connection-table room.

In one container (cgroup) a CUDA HTTP service runs beside a plain TCP listener that
holds every connection it accepts: the collector traces the listener as a related
server, so its connections go into the kernel's table too. With --max-connections 256
the listener's share is 128 (kernel_io/connection_table.py, related_server_share): of its idle
connections opened before the collector, 128 are seeded from /proc and the rest left;
every one accepted afterwards is refused its entry and counted
(connections_over_share). The GPU service keeps its room: its keep-alive connections
from before the collector and new ones after the flood each get one span with exactly
the launches its request asked for, and the collector answers for its state throughout."""
from __future__ import annotations

import http.client
import socket
import sys

from tests.bpf.targets.relia_support import TARGETS, state, stopped_counters, wait_until
from tests.bpf.test_reliability_neighbours import _raise_fd_limit
from tests.harness import Target, children_of, free_port, server_spans

TABLE = 256
SHARE = TABLE // 2  # one related server
BEFORE = 200        # the listener's idle connections opened before the collector
AFTER = 200         # and after it started
OLD, NEW = 8, 20    # the GPU service's keep-alive connections from before, and new ones


def _flood(port: int, n: int) -> list:
    return [socket.create_connection(("127.0.0.1", port), timeout=10) for _ in range(n)]


def _ask(conns: list, first: int) -> dict:
    """One request per connection, request i making first + i launches: port -> launches."""
    asked = {}
    for i, c in enumerate(conns):
        c.request("GET", f"/work?launches={first + i}")
        assert c.getresponse().read() == b"ok"
        asked[c.sock.getsockname()[1]] = first + i
    return asked


def test_a_related_listeners_flood_leaves_the_gpu_service_traced(receiver, start_collector, targets):
    _raise_fd_limit(4 * (BEFORE + AFTER) + 512)
    # An event loop reads a connection after epoll says it is readable, so a keep-alive
    # connection from before the collector has its next request traced (a thread blocked
    # in read() then misses that one: tests/bpf/test_preexisting_connections.py).
    service = Target([sys.executable, str(TARGETS / "cuda_http.py"), "asgi", str(free_port())])
    targets.append(service)
    service.go()
    listener = Target([sys.executable, str(TARGETS / "idle_listener.py")], beside=service)
    targets.insert(0, listener)  # stopped first: the service's cgroup is removed with it
    clients = _flood(listener.port, BEFORE)
    old = [http.client.HTTPConnection("127.0.0.1", service.port, timeout=20) for _ in range(OLD)]
    try:
        _ask(old, 1)  # open before the collector: seeded from /proc
        collector = start_collector("--max-connections", str(TABLE))
        collector.wait_traced(service.pid)
        collector.wait_traced(listener.pid)
        assert wait_until(lambda: state(collector)["bpf.conns"] == SHARE + OLD, 10), state(collector)

        clients += _flood(listener.port, AFTER)
        asked = _ask(old, 20)
        new = [http.client.HTTPConnection("127.0.0.1", service.port, timeout=20) for _ in range(NEW)]
        try:
            asked.update(_ask(new, 40))
            assert state(collector)["bpf.conns"] == SHARE + OLD + NEW  # it answers, mid-flood
        finally:
            for c in new:
                c.close()
        mine = lambda spans: [s for s in server_spans(spans, service.pid)  # noqa: E731
                              if s.attributes["gpu.launches"] >= 20]
        assert receiver.wait_for(lambda s: len(mine(s)) >= OLD + NEW, 30), \
            sorted(x.attributes["gpu.launches"] for x in mine(receiver.spans))
    finally:
        for c in clients + old:
            c.close()
    assert collector.stop() == 0
    counters = stopped_counters(collector)
    # Every accept, the first too: the listener was already blocked in accept() when the
    # probes attached, and the probes see each call at its exit (bpf/http_syscalls.c).
    assert counters.get("connections_over_share") == AFTER, counters
    assert not counters.get("connections_untracked"), counters  # the table itself never filled
    spans = receiver.spans
    got = {s.attributes["client.port"]: s for s in mine(spans)}
    assert sorted(got) == sorted(asked)  # one span per request, none missing
    for port, launches in asked.items():
        span = got[port]
        kids = children_of(spans, span)
        assert span.attributes["gpu.launches"] == launches, span.attributes
        assert [k.name for k in kids] == ["cudaLaunchKernel"] * launches
