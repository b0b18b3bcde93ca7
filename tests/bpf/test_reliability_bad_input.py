"""Bad input through the real socket probes on a real server: each case gives either
a correct span or a counted, logged drop; nothing crashes; a normal request on a new
connection afterwards still gives a correct span. (Fuzzing of the parser itself is in
tests/unit/pipeline/*properties*.py; pipelining in test_http_framing.py.)"""
from __future__ import annotations

import random
import socket
import sys
import time

import pytest

from tests.bpf.targets.relia_support import TARGETS, stopped_counters
from tests.harness import Target, server_spans

FOLLOW_UP = 3  # launches of the normal request after each bad input


@pytest.fixture
def start_target():
    """slow_http.py under its own name, which the collector alone traces (--exe), so other
    HTTP/CUDA processes on the host cannot add to its counters."""
    started = []

    def start() -> Target:
        started.append(Target([sys.executable, str(TARGETS / "slow_http.py"), "0"], {"RELIA_COMM": "relia_bad"}))
        return started[-1]
    yield start
    for t in started:
        t.stop()


def _started(start_collector, start_target):
    collector = start_collector("--exe", "relia_bad")
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    return collector, target


def _send_and_close(port: int, pieces, linger: float = 0.3, nodelay: bool = False) -> bytes:
    """Sends the pieces on a new connection, reads what comes back for `linger` s, closes."""
    got = b""
    with socket.create_connection(("127.0.0.1", port)) as s:
        if nodelay:
            s.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        for p in pieces:
            s.sendall(p)
            if nodelay:
                time.sleep(0.002)
        s.settimeout(linger)
        try:
            while chunk := s.recv(65536):
                got += chunk
        except (socket.timeout, ConnectionResetError):
            pass
    return got


def _finish(collector, receiver, target, expect: list) -> dict:
    """Normal request on a new connection, then stop. `expect`: (path, launches, status)
    of every span the bad input may give besides it (`/nothing` from go() aside)."""
    target.get(f"/work?launches={FOLLOW_UP}")
    want = sorted(expect + [("/work", FOLLOW_UP, 200)])
    receiver.wait_for(lambda s: len([x for x in server_spans(s, target.pid)
                                     if x.attributes["url.path"] != "/nothing"]) >= len(want), 15)
    assert collector.stop() == 0
    counters = stopped_counters(collector)
    got = sorted((s.attributes["url.path"], s.attributes["gpu.launches"],
                  s.attributes.get("http.response.status_code"))
                 for s in server_spans(receiver.spans, target.pid) if s.attributes["url.path"] != "/nothing")
    # On a miss, what the collector did with the calls and the connections.
    assert got == want, (got, collector.counts(), [l for l in collector.log.lines if " INFO " not in l][-10:])
    for s in server_spans(receiver.spans, target.pid):
        assert s.attributes["http.request.method"] == "GET"
        assert s.name == f"GET {s.attributes['http.route']}"
    return counters


def _assert_dropped_not_http(collector, counters):
    assert counters.get("connections_unknown_protocol") == 1, counters  # no protocol claims it
    assert counters.get("http_parse_errors", 0) == 0, counters
    assert [l for l in collector.log.lines if "not HTTP/1.x" in l], collector.log.lines


def test_binary_garbage(receiver, start_collector, start_target):
    collector, target = _started(start_collector, start_target)
    garbage = random.Random(7).randbytes(4096).replace(b"\n", b"\x00")
    assert garbage[:4] not in (b"GET ", b"POST", b"PUT ", b"HEAD")
    _send_and_close(target.port, [garbage])
    _assert_dropped_not_http(collector, _finish(collector, receiver, target, []))


def test_redis_protocol_on_the_http_port(receiver, start_collector, start_target):
    collector, target = _started(start_collector, start_target)
    _send_and_close(target.port, [b"*1\r\n$4\r\nPING\r\n"])
    _assert_dropped_not_http(collector, _finish(collector, receiver, target, []))


def test_http2_prior_knowledge_to_an_http1_server(receiver, start_collector, start_target):
    """The preface is HTTP/2's; the stdlib server answers in HTTP/1.x (a 505 page), which is
    not HTTP/2 framing: the connection is dropped and counted, no span. The server never
    spoke HTTP/2 on it, so no request hides there: the server closes it after the client
    saw its end of the reply (shutdown, then close), and the follow-up's calls, made while
    it may still be open, are its own (they were `ambiguous` in 2 of 7 CI runs when a
    broken HTTP/2 connection always hid requests)."""
    collector, target = _started(start_collector, start_target)
    settings = b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"  # empty SETTINGS frame
    _send_and_close(target.port, [b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n" + settings], linger=2)
    counters = _finish(collector, receiver, target, [])
    assert counters.get("h2_parse_errors") == 1, counters
    assert counters.get("connections_unknown_protocol", 0) == 0, counters
    assert [l for l in collector.log.lines if "dropping HTTP/2 connection" in l
            and "the server never answered in HTTP/2" in l], collector.log.lines


def test_64k_request_head(receiver, start_collector, start_target):
    """Far beyond the probe's 1 KiB copy: the start line is kept; stdlib answers 431
    without doing the work, so the span is GET /work with no launches and status 431."""
    collector, target = _started(start_collector, start_target)
    head = (b"GET /work?launches=2 HTTP/1.1\r\nHost: x\r\nX-Pad: " + b"a" * 65536 + b"\r\n\r\n")
    reply = _send_and_close(target.port, [head], linger=2)
    assert reply.startswith(b"HTTP/1.1 431"), reply[:60]
    counters = _finish(collector, receiver, target, [("/work", 0, 431)])
    assert counters.get("http_parse_errors", 0) == 0, counters


def test_one_byte_writes(receiver, start_collector, start_target):
    collector, target = _started(start_collector, start_target)
    req = b"GET /work?launches=4 HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"
    reply = _send_and_close(target.port, [req[i:i + 1] for i in range(len(req))], linger=2, nodelay=True)
    assert reply.startswith(b"HTTP/1.1 200"), reply
    counters = _finish(collector, receiver, target, [("/work", 4, 200)])
    assert counters.get("http_parse_errors", 0) == 0, counters


def _root_launches(spans, pid) -> int:
    return sum(s.attributes.get("gpu.launches", 0) for s in spans
               if s.parent_span_id == "" and s.attributes.get("process.pid") == pid)


def test_client_closes_after_half_a_head(receiver, start_collector, start_target):
    """stdlib takes EOF as the end of the headers and serves /work?launches=5; the
    collector never saw a complete head, so there is no span for it: the 5 launches
    must still be counted (outside requests), and the cut-short head counted as a drop."""
    collector, target = _started(start_collector, start_target)
    _send_and_close(target.port, [b"GET /work?launches=5 HTTP/1.1\r\nHost: x\r\n"], linger=1)
    counters = _finish(collector, receiver, target, [])
    assert _root_launches(receiver.spans, target.pid) == 5 + FOLLOW_UP
    assert counters.get("writes_without_request", 0) >= 1 or counters.get("requests_incomplete", 0) >= 1, counters


def test_half_a_head_that_is_never_served_is_a_counted_logged_drop(receiver, start_collector, start_target):
    """A head cut short in its request line: stdlib answers 400 and nothing is served."""
    collector, target = _started(start_collector, start_target)
    _send_and_close(target.port, [b"GET /work?launches=5 HTT"], linger=1)
    counters = _finish(collector, receiver, target, [])
    assert counters.get("http_incomplete_heads", 0) == 1, repr(counters)
    assert any(f"pid {target.pid} fd" in l for l in collector.log.lines), collector.log.lines[-10:]


def test_client_closes_before_a_slow_response(receiver, start_collector, start_target):
    collector, target = _started(start_collector, start_target)
    with socket.create_connection(("127.0.0.1", target.port)) as s:
        s.sendall(b"GET /slow?launches=2&ms=800 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert target.log.wait_for("launched 2", 10)
    time.sleep(1.2)  # the server answers into a closed connection
    target.get(f"/work?launches={FOLLOW_UP}")
    assert receiver.wait_for(lambda sp: {x.attributes["url.path"] for x in server_spans(sp, target.pid)}
                             >= {"/slow", "/work"}, 15)
    assert collector.stop() == 0
    counters = stopped_counters(collector)
    spans = {s.attributes["url.path"]: s for s in server_spans(receiver.spans, target.pid)}
    slow, work = spans["/slow"], spans["/work"]
    assert slow.attributes["gpu.launches"] == 2 and work.attributes["gpu.launches"] == FOLLOW_UP
    assert len([s for s in server_spans(receiver.spans, target.pid) if s.attributes["url.path"] == "/slow"]) == 1
    if slow.status_code == 2:  # ERROR: the response never left, counted as incomplete
        assert counters.get("requests_incomplete", 0) >= 1, counters
    else:  # the write went out before the peer's reset: a complete 200
        assert slow.attributes["http.response.status_code"] == 200
