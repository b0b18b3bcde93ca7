"""The /proc facts stage: what the stitcher needs from /proc arrives on records, read once
where a record first needs it (tests' named fakes of the readers count their calls)."""
from otel_gpu.own_sockets import REFRESH_NS, OwnSockets
from otel_gpu.pipeline.proc_facts import AUDIT_ALL_NS, ProcFacts
from otel_gpu.records import (EV_SOCK_READ, EV_SOCK_WRITE, Accept, OpenSockets, ProcessGroup, ProcExit, SockClose,
                              SockIo, Tick)

PID = 41


class FakeProc:
    """Named fake of the /proc readers: fixed answers, every call recorded."""

    def __init__(self) -> None:
        self.calls: list = []
        self.sockets = {10: 900, 11: 901}

    def port(self, pid, listen_fd, fd):
        self.calls.append(("port", pid, listen_fd, fd))
        return 8000

    def peer(self, pid, fd):
        self.calls.append(("peer", pid, fd))
        return ("10.0.0.9", 5555)

    def group(self, pid):
        self.calls.append(("group", pid))
        return "cg:/pod"

    def sockets_of(self, pid):
        self.calls.append(("sockets", pid))
        return dict(self.sockets)


def facts():
    f = FakeProc()
    return f, ProcFacts(f.port, f.peer, f.group, f.sockets_of)


def io(kind, fd, pid=PID):
    return SockIo(kind, pid, 1, 5, fd, 4, b"GET ", b"", 0, 1)


def test_an_accept_carries_its_port_and_the_peer_it_did_not_name():
    f, stage = facts()
    named = Accept(PID, 1, 1, 10, 3, "10.0.0.1", 4000)
    unnamed = Accept(PID, 1, 2, 11, 3, None, None)  # accept(fd, NULL, NULL)
    out = stage.process([named, unnamed])
    assert out == [ProcessGroup(PID, "cg:/pod"), named, unnamed]
    assert (named.server_port, named.peer_addr, named.peer_port) == (8000, "10.0.0.1", 4000)
    assert (unnamed.server_port, unnamed.peer_addr, unnamed.peer_port) == (8000, "10.0.0.9", 5555)
    assert f.calls.count(("peer", PID, 10)) == 0 and f.calls.count(("group", PID)) == 1


def test_an_untracked_accept_reads_nothing_more():
    f, stage = facts()
    a = Accept(PID, 1, 1, 10, 3, None, None, tracked=False)
    stage.process([a])
    assert a.server_port is None and f.calls == [("group", PID)]


def test_a_read_on_a_connection_never_accepted_gets_an_accept_first():
    f, stage = facts()
    read = io(EV_SOCK_READ, 12)
    out = stage.process([read, io(EV_SOCK_READ, 12), io(EV_SOCK_WRITE, 13)])
    made = out[1]
    assert isinstance(made, Accept) and (made.fd, made.listen_fd, made.server_port, made.peer_addr) == (12, -1, 8000, None)
    assert out[2] is read and sum(isinstance(o, Accept) for o in out) == 1  # once; a write makes none


def test_groups_once_per_process_and_never_for_its_exit():
    f, stage = facts()
    out = stage.process([ProcExit(PID + 1, 3), io(EV_SOCK_WRITE, 10), io(EV_SOCK_WRITE, 10)])
    assert [o for o in out if isinstance(o, ProcessGroup)] == [ProcessGroup(PID, "cg:/pod")]
    stage.process([ProcExit(PID, 9)])
    assert [o for o in stage.process([io(EV_SOCK_WRITE, 10)]) if isinstance(o, ProcessGroup)]  # a new process


def test_sockets_are_read_for_untracked_connections_each_tick_and_for_all_each_audit_interval():
    f, stage = facts()
    stage.process([Accept(PID, 1, 1, 10, 3, "a", 1), Accept(PID + 1, 1, 1, 20, 3, None, None, tracked=False)])
    first = [o for o in stage.process([Tick(1)]) if isinstance(o, OpenSockets)]
    assert {(o.tgid, o.everyone) for o in first} == {(PID, True), (PID + 1, True)}  # the first Tick audits all
    again = [o for o in stage.process([Tick(2)]) if isinstance(o, OpenSockets)]
    assert [(o.tgid, o.everyone) for o in again] == []  # the untracked fd 20 was gone: released
    stage.process([Accept(PID + 1, 1, 3, 11, 3, None, None, tracked=False)])  # its socket is there (901)
    again = [o for o in stage.process([Tick(3)]) if isinstance(o, OpenSockets)]
    assert [(o.tgid, o.everyone, o.fds) for o in again] == [(PID + 1, False, {10: 900, 11: 901})]
    later = [o for o in stage.process([Tick(1 + AUDIT_ALL_NS)]) if isinstance(o, OpenSockets)]
    assert {(o.tgid, o.everyone) for o in later} == {(PID, True), (PID + 1, True)}
    stage.process([SockClose(PID, 1, 4, 10)])
    assert all(o.tgid != PID for o in stage.process([Tick(2 + 2 * AUDIT_ALL_NS)]) if isinstance(o, OpenSockets))


def test_an_accept_from_the_collectors_own_socket_says_so_and_its_bytes_open_no_request():
    """The collector's export to a receiver it traces (own_sockets.py): marked at the
    accept, and the stitcher follows none of its bytes (a span per export otherwise)."""
    from otel_gpu.pipeline.stitcher import Stitcher
    from otel_gpu.pipeline.model import Request
    f = FakeProc()
    own = OwnSockets(read=lambda: {("127.0.0.1", 4000): {8000}, ("127.0.0.1", 4001): {4317}})
    stage = ProcFacts(f.port, f.peer, f.group, f.sockets_of, own=own)
    ours, theirs = Accept(PID, 1, 1, 10, 3, "127.0.0.1", 4000), Accept(PID, 1, 1, 11, 3, "127.0.0.1", 4001)
    stage.process([ours, theirs])
    assert ours.own and not theirs.own
    s = Stitcher(span_budget=16)
    head = b"GET /v1/traces HTTP/1.1\r\nHost: x\r\n\r\n"
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    out = s.process([ours, theirs] + [SockIo(EV_SOCK_READ, PID, 1, 10, fd, len(head), head, b"", 0) for fd in (10, 11)]
                    + [SockIo(EV_SOCK_WRITE, PID, 1, 20, fd, len(reply), reply, reply[-8:], 0) for fd in (10, 11)])
    assert [r.fd for r in out if isinstance(r, Request)] == [11]
    assert s.stats.snapshot()["connections_own_export"] == 1


def _unsure_setup():
    """A client's accept read our sockets; our export connected after that read, and the
    traced server accepted it within REFRESH_NS: not surely ours at its accept."""
    ends, now = {}, [0]
    own = OwnSockets(read=lambda: dict(ends), clock=lambda: now[0])
    f = FakeProc()
    stage = ProcFacts(f.port, f.peer, f.group, f.sockets_of, own=own)
    first = Accept(PID, 1, 1, 10, 3, "127.0.0.1", 4000)
    stage.process([first])
    ends[("127.0.0.1", 4001)] = {8000}  # our export connection, newer than that read
    now[0] = REFRESH_NS // 2
    ours = Accept(PID, 1, 2, 11, 3, "127.0.0.1", 4001)
    return stage, first, ours


def test_an_accept_not_surely_ours_is_asked_again_at_the_next_tick_and_sent_again_marked():
    stage, first, ours = _unsure_setup()
    closed = Accept(PID, 1, 2, 12, 3, "127.0.0.1", 4002)  # not sure either, but closed before the Tick
    client = Accept(PID, 1, 2, 13, 3, "127.0.0.1", 4003)  # not sure, and not ours
    stage.process([ours, closed, client, SockClose(PID, 1, 3, 12)])
    assert not first.own and not ours.own and not closed.own and not client.own
    again = [r for r in stage.process([Tick(10)]) if isinstance(r, Accept)]
    assert [(a.fd, a.ts_ns, a.peer_port, a.own, a.again) for a in again] == [(11, 2, 4001, True, True)]
    assert not [r for r in stage.process([Tick(20)]) if isinstance(r, Accept)]  # asked once


def test_a_connection_found_ours_after_its_accept_ends_its_requests_with_no_span():
    """The stitcher, told again (the Accept marked own): the request open on it ends with
    no span and is counted; its later bytes open none."""
    from otel_gpu.pipeline.stitcher import Stitcher
    from otel_gpu.pipeline.model import Request
    stage, _, ours = _unsure_setup()
    s = Stitcher(span_budget=16)
    head = b"POST /opentelemetry.proto.collector.trace.v1.TraceService/Export HTTP/1.1\r\nHost: x\r\n\r\n"
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    read = SockIo(EV_SOCK_READ, PID, 1, 3, 11, len(head), head, b"", 0)
    out = s.process(stage.process([ours, read]))
    assert not [r for r in out if isinstance(r, Request)] and s.state()["open_requests"] == 1
    out = s.process(stage.process([Tick(10)]) + [read, SockIo(EV_SOCK_WRITE, PID, 1, 20, 11, len(reply), reply,
                                                                 reply[-8:], 0)])
    assert not [r for r in out if isinstance(r, Request)] and s.state()["open_requests"] == 0
    counts = s.stats.snapshot()
    assert (counts["connections_own_export"], counts["requests_own_export"]) == (1, 1)
    assert "requests_finished" not in counts


def _newer_socket_on_our_fd(newer: Accept, inode=None) -> None:
    """Our connection (`inode`) is accepted on fd 11 and not surely ours; before the Accept
    sent again reaches the stitcher, `newer` (seen by the stitcher only: its ProcFacts
    record lost) holds fd 11 and serves a request. The connection there now is not touched."""
    from otel_gpu.pipeline.stitcher import Stitcher
    from otel_gpu.pipeline.model import Request
    stage, _, ours = _unsure_setup()
    ours.inode = inode
    s = Stitcher(span_budget=16)
    s.process(stage.process([ours]))
    head = b"GET /work HTTP/1.1\r\nHost: x\r\n\r\n"
    reply = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    s.process([newer, SockIo(EV_SOCK_READ, PID, 1, 6, 11, len(head), head, b"", 0)])
    out = s.process(stage.process([Tick(10)]) + [SockIo(EV_SOCK_WRITE, PID, 1, 20, 11, len(reply), reply,
                                                                   reply[-8:], 0)])
    assert [(r.fd, r.error, r.status) for r in out if isinstance(r, Request)] == [(11, None, 200)]
    assert "connections_own_export" not in s.stats.snapshot()


def test_a_connection_found_ours_after_it_was_replaced_is_left_as_it_is():
    """Its close and the next accept went unseen: another peer on the fd."""
    _newer_socket_on_our_fd(Accept(PID, 1, 5, 11, 3, "127.0.0.1", 4009))


def test_a_connection_found_ours_is_known_by_its_inode_not_only_its_peer():
    """The same peer (the client reused its port), another inode: by inode where both know
    it; with no inode on either side the peer decides (the case above)."""
    _newer_socket_on_our_fd(Accept(PID, 1, 5, 11, 3, "127.0.0.1", 4001, inode=701), inode=700)
