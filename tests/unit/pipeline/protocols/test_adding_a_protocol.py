"""Adding a protocol is one folder plus a registration: a tiny multiplexed line protocol,
defined here and registered in protocols.PROTOCOLS, gives spans through the unchanged
stitcher, with attribution by its rules, beside HTTP/1 connections.

The protocol (a test fake: no such protocol exists): requests `LINE <stream> <path>\\n`,
responses `DONE <stream> <status>\\n`, resets `RST <stream>\\n`, many streams open at once."""
import logging
import random

import pytest

from otel_gpu.pipeline import protocols
from otel_gpu.pipeline.model import Request
from otel_gpu.pipeline.protocols.base import (Notice, Protocol, ProtocolError, RequestFinished, RequestHead,
                                              RequestStarted, ResponseStatus, Session, StreamReset)
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, Accept, SockClose, SockIo
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline import calls

PID = 5151
_t = [1_000_000]


def T():
    _t[0] += 1000
    return _t[0]


class LineSession(Session):
    def __init__(self, config):
        self.extra = config.extra_headers
        self.buf = b""

    @property
    def partial(self):
        return bool(self.buf)

    def _lines(self, data):
        self.buf += data
        *lines, self.buf = self.buf.split(b"\n")
        return lines

    def on_read(self, data, length, ts_ns, tid):
        out = []
        for line in self._lines(data):
            word, stream, rest = (line.split(b" ", 2) + [b"", b""])[:3]
            if word != b"LINE" or not stream.isdigit():
                return [ProtocolError("line_errors", "not the line protocol", "malformed LINE")]
            head = RequestHead("CALL", rest.decode(), "1", {}, protocol="line")
            out.append(RequestStarted(int(stream), head, ts_ns, tid))
        return out

    def on_write(self, data, length, tail, ts_ns, tid):
        out = []
        for line in data.split(b"\n"):
            word, _, rest = line.partition(b" ")
            if word == b"STATUS":
                stream, status = rest.split()
                out.append(ResponseStatus(int(stream), int(status)))
            elif word == b"DONE":
                stream, status = rest.split()
                out.append(RequestFinished(int(stream), ts_ns, int(status)))
            elif word == b"RST":
                out.append(StreamReset(int(rest), ts_ns, "stream reset"))
        return out

    def abandon(self):
        return [Notice("line_abandoned", "line connection dropped")]


class LineProtocol(Protocol):
    name, label = "line", "LINE"

    def detect(self, prefix):
        if prefix.startswith(b"LINE "):
            return True
        return None if b"LINE "[:len(prefix)] == prefix else False

    def session(self, config):
        return LineSession(config)


@pytest.fixture
def registered(monkeypatch):
    """The one line a new protocol adds to the registry."""
    monkeypatch.setattr(protocols, "PROTOCOLS", [*protocols.PROTOCOLS, LineProtocol()])


def io(kind, raw, fd, tid):
    return SockIo(kind, PID, tid, T(), fd, len(raw), raw[:1024], raw[-8:])


def launch(tid):
    return calls.cuda("cudaLaunchKernel", tid, 0x1000, 0, 0, PID, 0, ts=T())


def spans(out):
    return {r.head.path: r for r in out if isinstance(r, Request)}


def test_multiplexed_line_streams_become_spans_with_protocol_attribution(registered):
    s = Stitcher(span_budget=64, rng=random.Random(3))
    out = s.process([Accept(PID, 1, T(), 7, 3, "10.0.0.1", 5000),
                     io(EV_SOCK_READ, b"LI", 7, 1),  # too short to tell: pending
                     io(EV_SOCK_READ, b"NE 1 /a\n", 7, 1), launch(1),  # one stream open: thread
                     io(EV_SOCK_READ, b"LINE 3 /b\n", 7, 1), launch(1),  # two open: ambiguous
                     io(EV_SOCK_WRITE, b"STATUS 3 201\n", 7, 1),
                     io(EV_SOCK_WRITE, b"DONE 1 200\n", 7, 1), launch(1),  # only /b left
                     io(EV_SOCK_WRITE, b"DONE 3 500\n", 7, 1),
                     io(EV_SOCK_READ, b"LINE 5 /c\n", 7, 1), io(EV_SOCK_WRITE, b"RST 5\n", 7, 1),
                     SockClose(PID, 1, T(), 7)])
    got = spans(out)
    assert sorted(got) == ["/a", "/b", "/c"]
    a, b, c = got["/a"], got["/b"], got["/c"]
    assert (a.status, a.error, b.status, b.error, c.error) == (200, None, 500, None, "stream reset")
    assert a.head.protocol == "line" and a.fd == 7 and a.peer_port == 5000
    assert [att for _, att in a.sink.calls] == ["thread"] and a.sink.summary.ambiguous == 0.5
    assert [att for _, att in b.sink.calls] == ["thread"] and b.sink.summary.ambiguous == 0.5
    assert c.sink.calls == []
    assert a.start_ns < b.start_ns < a.end_ns < b.end_ns
    snap = s.stats.snapshot()
    assert snap.get("requests_incomplete") == 1 and snap.get("line_abandoned") == 1
    assert not snap.get("connections_unknown_protocol") and not snap.get("http_parse_errors")
    assert s.procs[PID].conns == {} and s.procs[PID].open == []


def test_http1_beside_it_is_unchanged_and_errors_use_the_protocols_counter(registered, caplog):
    s = Stitcher(span_budget=64, rng=random.Random(3))
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    with caplog.at_level(logging.WARNING):
        out = s.process([Accept(PID, 1, T(), 7, 3, "10.0.0.1", 5000), Accept(PID, 2, T(), 8, 3, "10.0.0.1", 5001),
                         io(EV_SOCK_READ, b"LINE 1 /a\n", 7, 1),
                         io(EV_SOCK_READ, b"GET /h HTTP/1.1\r\n\r\n", 8, 2), launch(2),
                         io(EV_SOCK_WRITE, ok, 8, 2),
                         io(EV_SOCK_READ, b"nonsense\n", 7, 1), launch(1)])
    got = spans(out)
    assert sorted(got) == ["/a", "/h"]
    assert got["/h"].status == 200 and [att for _, att in got["/h"].sink.calls] == ["thread"]
    assert got["/a"].error == "malformed LINE"
    assert s.stats.snapshot()["line_errors"] == 1
    assert any(f"pid {PID} fd 7: not the line protocol" in r.getMessage() for r in caplog.records)
    assert s.procs[PID].broken == {1: {7}}  # its thread gives no thread attribution now


def test_unregistered_the_same_bytes_are_no_protocol():
    s = Stitcher(span_budget=64, rng=random.Random(3))
    out = s.process([Accept(PID, 1, T(), 7, 3, "10.0.0.1", 5000), io(EV_SOCK_READ, b"LINE 1 /a\n", 7, 1)])
    assert spans(out) == {}
    assert s.stats.snapshot()["connections_unknown_protocol"] == 1
