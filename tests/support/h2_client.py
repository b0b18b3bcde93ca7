"""An HTTP/2 client on the `h2` package (PyPI): every request as its own stream on one
prior-knowledge (h2c) connection, all sent at once, so the server has them open
together. Shared by the HTTP/2 tests and the bench."""
from __future__ import annotations

import socket
import time

import h2.config
import h2.connection
import h2.events


def h2_get_all(port: int, paths: list[str], timeout: float = 30, headers=None, dribble: int = 0) -> dict:
    """Sends every path as its own stream on one connection at once; returns {stream id:
    (path, status)} once all have ended (a stream not ended by `timeout`: status None).
    `headers(path)`: extra request headers for that path's stream. `dribble`: the
    requests' bytes go out `dribble` bytes at a time, 2 ms apart (the server's reads then
    cut frames, their headers included, anywhere)."""
    conn = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    conn.initiate_connection()
    # A window large enough that no response waits on our WINDOW_UPDATE.
    conn.increment_flow_control_window(1 << 24)
    sock = socket.create_connection(("127.0.0.1", port), timeout=timeout)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    streams = {}
    for path in paths:
        sid = conn.get_next_available_stream_id()
        extra = list(headers(path)) if headers else []
        conn.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                (":authority", f"127.0.0.1:{port}"), *extra], end_stream=True)
        streams[sid] = [path, None]
    out = conn.data_to_send()
    for at in range(0, len(out), dribble or len(out)):
        sock.sendall(out[at:at + (dribble or len(out))])
        if dribble:
            time.sleep(0.002)
    return receive_all(conn, sock, streams, time.monotonic() + timeout)


def receive_all(conn, sock, streams: dict, deadline: float, rest: bytes = b"") -> dict:
    """Reads the responses of `streams` ({stream id: [path, None]}: their statuses filled
    in) until all have ended or `deadline`, starting with `rest` (bytes already read);
    closes the connection; returns {stream id: (path, status)}."""
    ended = set()
    while len(ended) < len(streams) and time.monotonic() < deadline:
        data, rest = rest or sock.recv(65536), b""
        if not data:
            break
        for ev in conn.receive_data(data):
            if isinstance(ev, h2.events.ResponseReceived):
                streams[ev.stream_id][1] = int(dict(ev.headers)[b":status"])
            elif isinstance(ev, h2.events.DataReceived):
                conn.acknowledge_received_data(ev.flow_controlled_length, ev.stream_id)
            elif isinstance(ev, (h2.events.StreamEnded, h2.events.StreamReset)):
                ended.add(ev.stream_id)
        sock.sendall(conn.data_to_send())
    conn.close_connection()
    sock.sendall(conn.data_to_send())
    sock.close()
    return {sid: tuple(v) for sid, v in streams.items()}
