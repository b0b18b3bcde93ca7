"""Stitcher and the protocol registry: a connection's first bytes pick its protocol, also
when they come a byte at a time; bytes that cannot be told are counted, never parsed."""
from otel_gpu.pipeline.protocols.base import SessionConfig
from otel_gpu.pipeline.protocols.http1 import PROTOCOL as HTTP1
from otel_gpu.records import EV_SOCK_READ, SockClose, SockIo
from tests.unit.pipeline.test_stitcher import FD, OK, PID, T, accept, cuda, get, new, read, requests, write


def test_a_head_read_a_byte_at_a_time_is_detected_and_starts_at_its_first_byte():
    s = new()
    raw = get("/one-byte")
    reads = [read(raw[i:i + 1]) for i in range(len(raw))]
    out = s.process([accept(), *reads, cuda(), write(OK)])
    (r,) = requests(out)
    assert r.head.path == "/one-byte" and r.status == 200 and r.start_ns == reads[0].ts_ns
    assert [a for _, a in r.sink.calls] == ["thread"]
    assert s.procs[PID].conns[FD].session is not None and s.procs[PID].conns[FD].prefix == b""


def test_a_thread_whose_first_bytes_are_pending_is_not_given_another_request_by_process():
    """Thread 2 has read "GE" (a head may be on its way): its call is not the only open
    request's by `process`, as for a half-read head."""
    s = new()
    s.process([accept(), read(get()), accept(fd=9, tid=2), read(b"GE", fd=9, tid=2), cuda(tid=2)])
    assert s.procs[PID].conns[9].session is None and s.procs[PID].partial_heads == {2: 9}
    (r,) = requests(s.process([write(OK)]))
    assert r.sink.calls == [] and s.attributed["process"] == 0 and s.attributed["ambiguous"] == 1


def test_closing_before_the_protocol_can_be_told_is_counted():
    s = new()
    s.process([accept(), read(b"GE"), SockClose(PID, 1, T(), FD)])
    assert s.stats.snapshot()["connections_unknown_protocol"] == 1
    assert s.procs[PID].conns == {}


def test_a_pending_prefix_whose_rest_was_not_copied_is_no_protocol():
    """The probe copied 2 bytes of a longer read: no later read continues them."""
    s = new()
    cut = SockIo(EV_SOCK_READ, PID, 1, T(), FD, 4000, b"GE", b"")
    out = s.process([accept(), cut, read(get()), write(OK)])
    assert requests(out) == []
    assert s.stats.snapshot()["connections_unknown_protocol"] == 1
    assert s.procs[PID].broken == {1: {FD}}


def test_empty_reads_tell_nothing():
    s = new()
    eof = SockIo(EV_SOCK_READ, PID, 1, T(), FD, 0, b"", b"")
    s.process([accept(), eof])
    assert s.procs[PID].conns[FD].session is None and s.procs[PID].conns[FD].early == []
    (r,) = requests(s.process([read(get()), write(OK)]))
    assert r.status == 200 and type(s.procs[PID].conns[FD].session) is type(HTTP1.session(SessionConfig()))
