"""HTTP/2 by `Upgrade: h2c` (RFC 7540 3.2) with the bytes of real h2 peers: the session
taking over stream 1 already open, and the stitcher swapping the connection's session
(the upgraded request keeps its span; later streams as with prior knowledge). A
websocket 101 is never switched to HTTP/2."""
import random

import h2.config
import h2.connection

from otel_gpu.pipeline.model import Request
from otel_gpu.pipeline.protocols.base import (Handover, ProtocolError, RequestFinished, RequestHead,
                                              RequestStarted, ResponseStatus, SessionConfig)
from otel_gpu.pipeline.protocols.http2 import PROTOCOL
from otel_gpu.pipeline.protocols.http2.frames import DATA
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, Accept, SockIo
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline.protocols.http1.test_session_switch import switching, upgrade_request
from tests.unit.pipeline.protocols.http2.h2_wire import frame

PID, FD, TID = 4242, 10, 5
_t = [1_000_000]


def T():
    _t[0] += 1000
    return _t[0]


def read(raw: bytes):
    return SockIo(EV_SOCK_READ, PID, TID, T(), FD, len(raw), raw[:1024], b"")


def write(raw: bytes):
    return SockIo(EV_SOCK_WRITE, PID, TID, T(), FD, len(raw), raw[:1024], raw[-8:])


class Peers:
    """A real h2 client and server after the client's HTTP/1.1 upgrade request."""

    def __init__(self) -> None:
        self.client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
        self.settings = self.client.initiate_upgrade_connection()
        self.server = h2.connection.H2Connection(h2.config.H2Configuration(client_side=False))
        self.server.initiate_upgrade_connection(self.settings)

    def request(self, path: str) -> int:
        sid = self.client.get_next_available_stream_id()
        self.client.send_headers(sid, [(":method", "GET"), (":path", path), (":scheme", "http"),
                                       (":authority", "127.0.0.1")], end_stream=True)
        return sid

    def respond(self, sid: int, status: int, body: bytes = b"ok") -> None:
        self.server.send_headers(sid, [(":status", str(status))])
        self.server.send_data(sid, body, end_stream=True)

    def client_bytes(self) -> bytes:
        raw = self.client.data_to_send()
        self.server.receive_data(raw)
        return raw

    def server_bytes(self) -> bytes:
        raw = self.server.data_to_send()
        self.client.receive_data(raw)
        return raw


def new():
    s = Stitcher(span_budget=256, rng=random.Random(7))
    s.process([Accept(PID, TID, T(), FD, 3, "10.0.0.9", 40000)])
    return s


def requests(out):
    return [r for r in out if isinstance(r, Request)]


def test_the_upgraded_request_and_later_streams_each_get_one_request():
    s, peers = new(), Peers()
    out = s.process([read(upgrade_request(settings=peers.settings, path=b"/infer?id=1"))])
    out += s.process([write(switching()), write(peers.server_bytes())])  # hypercorn: 101, then SETTINGS
    assert requests(out) == []  # the upgraded request goes on under HTTP/2
    later = [peers.request(f"/infer?id={i}") for i in (2, 3, 4)]
    assert later == [3, 5, 7]
    out = s.process([read(peers.client_bytes())])  # preface, SETTINGS, three HEADERS
    assert requests(out) == []
    for sid, status in ((5, 404), (1, 200), (7, 500), (3, 200)):
        peers.respond(sid, status)
        out += s.process([write(peers.server_bytes())])
    done = requests(out)
    assert [(r.head.method, r.head.target, r.status, r.error) for r in done] == [
        ("GET", "/infer?id=3", 404, None), ("GET", "/infer?id=1", 200, None),
        ("GET", "/infer?id=4", 500, None), ("GET", "/infer?id=2", 200, None)]
    assert all((r.head.version, r.head.protocol, r.peer_port) == ("2", "h2", 40000) for r in done)
    assert s.procs[PID].conns[FD].streams == {} and s.procs[PID].open == []
    assert s.stats.snapshot().get("requests_incomplete", 0) == 0


def test_the_101_and_the_servers_first_frames_in_one_write():
    s, peers = new(), Peers()
    s.process([read(upgrade_request(settings=peers.settings))])
    peers.respond(1, 201)
    done = requests(s.process([write(switching() + peers.server_bytes())]))
    assert [(r.head.path, r.status, r.error) for r in done] == [("/infer", 201, None)]


def test_a_connection_dropped_after_the_switch_ends_the_upgraded_request_with_an_error():
    s, peers = new(), Peers()
    s.process([read(upgrade_request(settings=peers.settings)), write(switching())])
    done = requests(s.process([read(b"GET / HTTP/1.1\r\n\r\n")]))  # no preface: not HTTP/2
    assert [(r.head.path, r.error) for r in done] == [("/infer", "malformed HTTP/2")]
    assert s.stats.snapshot()["h2_parse_errors"] == 1


def test_a_websocket_101_ends_its_request_with_101_and_the_frames_after_it_are_ignored():
    s = new()
    out = s.process([read(b"GET /ws HTTP/1.1\r\nHost: x\r\nConnection: Upgrade\r\nUpgrade: websocket\r\n\r\n"),
                     write(switching(b"websocket")), write(b"\x81\x05hello"),
                     read(b"\x81\x85abcd\x00\x00\x00\x00\x00")])
    assert [(r.head.path, r.status, r.error) for r in requests(out)] == [("/ws", 101, None)]
    stats = s.stats.snapshot()
    assert stats["connections_upgraded"] == 1
    assert not any(k.startswith("h2_") or k in ("http_parse_errors", "http_response_errors") for k in stats), stats
    assert TID in s.procs[PID].broken  # its thread serves bytes we cannot follow


def test_the_session_with_stream_1_handed_over():
    head = RequestHead("GET", "/up", "1.1")
    sess = PROTOCOL.session(SessionConfig(), Handover({0: (1, head)}))
    peers = Peers()
    assert sess.on_write(*_w(peers.server_bytes())) == []
    peers.request("/next")
    events = sess.on_read(*_r(peers.client_bytes()))
    assert [(type(e), e.stream) for e in events] == [(RequestStarted, 3)]
    peers.respond(1, 204)
    events = sess.on_write(*_w(peers.server_bytes()))
    assert [(type(e), e.stream) for e in events] == [(ResponseStatus, 1), (RequestFinished, 1)]
    assert events[1].status == 204 and (head.version, head.protocol) == ("2", "h2")


def test_the_client_may_not_open_stream_1_again():
    head = RequestHead("GET", "/up", "1.1")
    sess = PROTOCOL.session(SessionConfig(), Handover({0: (1, head)}))
    peers = Peers()
    peers.client_bytes()
    raw = peers.client.data_to_send()  # nothing more queued: build a HEADERS on stream 1 by hand
    assert raw == b""
    client = h2.connection.H2Connection(h2.config.H2Configuration(client_side=True))
    client.initiate_connection()
    client.send_headers(1, [(":method", "GET"), (":path", "/again"), (":scheme", "http"), (":authority", "x")])
    events = sess.on_read(*_r(client.data_to_send()))
    assert not any(isinstance(e, RequestStarted) for e in events)


def test_http2_settings_bind_the_servers_frames_before_the_clients_preface_is_read():
    """A client that allows 32 KiB frames in HTTP2-Settings: the server may answer stream 1
    with such frames before it reads the preface."""
    big = (5).to_bytes(2, "big") + (32768).to_bytes(4, "big")  # SETTINGS_MAX_FRAME_SIZE
    answer = frame(DATA, 0, 1, b"x" * 20000)
    with_settings = PROTOCOL.session(SessionConfig(), Handover({0: (1, RequestHead("GET", "/", "1.1"))}, big))
    assert with_settings.on_write(*_w(answer)) == []
    without = PROTOCOL.session(SessionConfig(), Handover({0: (1, RequestHead("GET", "/", "1.1"))}))
    (error,) = without.on_write(*_w(answer))
    assert isinstance(error, ProtocolError) and error.counter == "h2_parse_errors"


def _r(raw: bytes):
    return raw[:1024], len(raw), 1, TID


def _w(raw: bytes):
    return raw[:1024], len(raw), raw[-64:], 2, TID


def test_streams_after_an_upgrade_are_sampled_each_on_its_own():
    """The kernel's draw (bpf/head_sampling.c) is the upgrading request's: streams after
    the switch take trace ids of their own, not on its side of the bound (the kernel
    drops its decision at the 101 too)."""
    from otel_gpu.pipeline import sampling
    bound = sampling.kernel_bound("traceidratio", "0.5")
    s = Stitcher(span_budget=8, rng=random.Random(11), sampler=sampling.make("traceidratio", "0.5"),
                 kernel_bound=bound)
    peers = Peers()
    s.process([Accept(PID, TID, T(), FD, 3, "10.0.0.9", 40000)])
    head = read(upgrade_request(settings=peers.settings, path=b"/infer?id=1"))
    head.req_start, head.draw = True, bound + 1  # unsampled by the kernel's draw
    out = s.process([head, write(switching()), write(peers.server_bytes())])
    later = [peers.request(f"/infer?id={i}") for i in range(2, 42)]
    out += s.process([read(peers.client_bytes())])
    for sid in [1] + later:
        peers.respond(sid, 200)
        out += s.process([write(peers.server_bytes())])
    done = {r.head.target: r for r in requests(out)}
    assert len(done) == 41 and not done["/infer?id=1"].sampled
    assert 5 <= sum(r.sampled for r in done.values()) <= 36  # binomial(40, 0.5): each stream its own
