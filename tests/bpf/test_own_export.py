"""The collector's own export is never traced: exporting to an OTLP receiver inside a
process it traces (tests/bpf/targets/otlp_sidecar.py, a GPU pod's collector sidecar in
one process), the collector's gRPC connection is accepted there like any client's. It is
recognised as the collector's own (own_sockets.py) and followed no further: no server
span for any TraceService/Export RPC reaches the receiver, while the process's own GPU
work does, and the connection is counted (connections_own_export). And the other way:
a client of a traced server that shares its local port with the collector's export
connection (Linux lets two connections to different servers share one port) is a client,
its requests traced."""
from __future__ import annotations

import socket
import sys
import time

from otel_gpu.proc import socket_fds, tcp_sockets
from tests.harness import TARGETS, Target, check_clean, server_spans, traced
from tests.support.collector_process import CollectorProcess


def test_export_to_a_traced_receiver_makes_no_span_of_its_own():
    sidecar = Target([sys.executable, str(TARGETS / "otlp_sidecar.py")])
    collector = None
    try:
        collector = CollectorProcess([], {"OTEL_EXPORTER_OTLP_ENDPOINT": f"http://127.0.0.1:{sidecar.port}",
                                          "OTEL_BSP_SCHEDULE_DELAY": "200"})
        sidecar.go_raw()
        collector.wait_traced(sidecar.pid)
        assert sidecar.log.wait_for(f"span GPU work outside requests {sidecar.pid}", 30)  # its exports arrive
        time.sleep(3)  # several more exports, each of which would have been a request
        names = [line.split()[1:] for line in sidecar.log.lines if line.startswith("span ")]
        assert not [n for n in names if "Export" in " ".join(n)], names
        collector.stop()
        check_clean(collector)
        assert collector.counts()["counted"].get("connections_own_export", 0) >= 1, "".join(collector.log.lines)
    finally:
        if collector is not None:
            collector.stop()
        sidecar.stop()


def _request(sock: socket.socket, launches: int) -> None:
    """One GET /work on a keep-alive connection, its whole response read (its body: ok)."""
    sock.sendall(f"GET /work?launches={launches} HTTP/1.1\r\nHost: x\r\n\r\n".encode())
    data, deadline = b"", time.monotonic() + 10
    while not data.endswith(b"ok"):
        assert time.monotonic() < deadline, data
        data += sock.recv(65536)


def _export_port(collector_pid: int, receiver_port: int, timeout: float = 10) -> int:
    """The local port of the collector's gRPC connection to its receiver."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        held = socket_fds("/proc", collector_pid)
        ports = [s.local_port for s in tcp_sockets("/proc", collector_pid)
                 if s.inode in held and s.peer_port == receiver_port]
        if ports:
            return ports[0]
        time.sleep(0.2)
    raise AssertionError(f"no connection from pid {collector_pid} to port {receiver_port}")


def test_a_client_on_the_collectors_export_port_is_traced(shared_collector, start_target):
    """gRPC's client sockets set SO_REUSEADDR, so a client that sets it too can bind the
    collector's export port and connect to another server: the traced one accepts a peer
    that is one of the collector's local ends, to another server port. Before 2026-12-06
    that connection was taken for the collector's own and its requests went unseen, with
    no drop counted (the intermittent loss of test_async_attribution)."""
    receiver = shared_collector.receiver
    target = traced(shared_collector, start_target)
    with socket.create_connection(("127.0.0.1", target.port)) as first:  # a span: the export connection is up
        _request(first, 1)
    assert receiver.wait_for(lambda spans: server_spans(spans, target.pid))
    port = _export_port(shared_collector.pid, receiver.port)
    with socket.socket() as client:
        client.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        client.bind(("127.0.0.1", port))
        client.connect(("127.0.0.1", target.port))
        for n in (2, 3):
            _request(client, n)

    def shared(spans):
        return sorted(s.attributes["gpu.launches"] for s in server_spans(spans, target.pid)
                      if s.attributes.get("client.port") == port)
    assert receiver.wait_for(lambda spans: shared(spans) == [2, 3], 15), shared(receiver.spans)
