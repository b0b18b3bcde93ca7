"""Stitcher connection state: connections the kernel's full table left untracked, and
connections whose close was never seen (synthetic events; /proc given as a dict)."""
import random

from otel_gpu.pipeline.model import ProcessWindow, Request
from otel_gpu.records import Accept, ProcExit, Tick
from otel_gpu.pipeline.proc_facts import AUDIT_ALL_NS
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline.facts import WithFacts
from otel_gpu.ratelimit import Stats
from tests.unit.pipeline.test_stitcher import FD, OK, PID, T, accept, cuda, get, read, write

OTHER_FD = 11


def untracked(fd=OTHER_FD, pid=PID):
    return Accept(pid, 1, T(), fd, 3, None, None, tracked=False)


class Sockets:
    """A process's open sockets as /proc would say: pid -> {fd: inode}."""

    def __init__(self, by_pid=None):
        self.by_pid = by_pid or {}

    def __call__(self, pid):
        return dict(self.by_pid.get(pid, {}))


def new(sockets=None):
    return WithFacts(Stitcher(span_budget=256, rng=random.Random(7), stats=Stats()), sockets_of=sockets)


def tick(s, now):
    return s.process([Tick(now)])


def test_untracked_connection_is_counted_in_state_and_released_with_the_process():
    s = new(Sockets())
    s.process([accept(), untracked()])
    assert (s.state()["conns"], s.state()["conns_untracked"]) == (2, 1)
    s.process([ProcExit(PID, T())])
    assert (s.state()["conns"], s.state()["conns_untracked"]) == (0, 0)


def test_a_process_with_untracked_connections_gets_no_thread_attribution():
    """The one open request's thread made the call, but a request we cannot see may be
    served on that thread too (an event loop): ambiguous, and the window says why."""
    s = new(Sockets())
    s.process([accept(), untracked(), read(get())])
    s.process([cuda(tid=1), cuda(tid=2)])  # its own thread, and another thread ("process")
    out = s.process([write(OK), Tick(T())])
    (req,) = [r for r in out if isinstance(r, Request)]
    assert req.sink.summary.launches == 0 and req.sink.summary.ambiguous == 2
    assert req.untracked_connections == 1
    (w,) = [r for r in out if isinstance(r, ProcessWindow)]
    assert w.attribution == "ambiguous" and w.untracked_connections == 1
    assert s.attributed["ambiguous"] == 2 and s.attributed["thread"] == s.attributed["process"] == 0


def test_calls_outside_requests_while_connections_are_untracked_are_flagged():
    s = new(Sockets())
    s.process([untracked(), cuda()])
    (w,) = [r for r in tick(s, T()) if isinstance(r, ProcessWindow)]
    assert w.attribution == "outside" and w.untracked_connections == 1 and w.sink.summary.launches == 1


def test_without_untracked_connections_attribution_is_unchanged():
    s = new(Sockets())
    s.process([accept(), read(get()), cuda(tid=1)])
    (req,) = [r for r in s.process([write(OK)]) if isinstance(r, Request)]
    assert req.sink.summary.launches == 1 and req.untracked_connections == 0


def test_untracked_connection_released_at_the_next_tick_once_its_socket_is_gone():
    sockets = Sockets({PID: {FD: 100, OTHER_FD: 101}})
    s = new(sockets)
    s.process([accept(), untracked()])
    tick(s, T())
    assert s.state()["conns_untracked"] == 1  # still open
    sockets.by_pid[PID] = {FD: 100}  # closed: its close was never seen
    tick(s, T())
    assert (s.state()["conns"], s.state()["conns_untracked"]) == (1, 0)
    assert "connection_closes_unseen" not in s.stats.snapshot()  # expected for an untracked one


def test_a_reused_fd_is_another_socket():
    sockets = Sockets({PID: {OTHER_FD: 101}})
    s = new(sockets)
    s.process([untracked()])
    tick(s, T())
    sockets.by_pid[PID] = {OTHER_FD: 555}  # closed, and the number reused by another socket
    tick(s, T())
    assert s.state()["conns_untracked"] == 0


def test_seeding_an_untracked_connection_makes_it_tracked():
    """The collector seeds it once the table has room: an ordinary Accept replaces it."""
    s = new(Sockets({PID: {OTHER_FD: 101}}))
    s.process([untracked(), accept(fd=OTHER_FD)])
    assert (s.state()["conns"], s.state()["conns_untracked"]) == (1, 0)
    s.process([read(get(), fd=OTHER_FD), cuda()])
    (req,) = [r for r in s.process([write(OK, fd=OTHER_FD)]) if isinstance(r, Request)]
    assert req.sink.summary.launches == 1 and req.untracked_connections == 0


def seed(fd=FD, inode=100):
    """What connection_seeding.py sends for a socket /proc listed (tid: the pid)."""
    return accept(fd, tid=PID, inode=inode)


def test_a_seed_of_the_connection_the_kernel_accepted_leaves_its_request_open():
    """The seed read /proc while the request was open and found its fd out of the kernel's
    table once it had closed (its close and response still in the ring): the same socket,
    not a new one. The request is answered exactly (a CI run dropped one, as "connection
    replaced", cutting its later calls off)."""
    s = new(Sockets())
    s.process([accept(inode=100), read(get()), cuda(tid=1)])
    s.process([seed(inode=100), cuda(tid=1)])
    (req,) = [r for r in s.process([write(OK)]) if isinstance(r, Request)]
    assert req.error is None and req.sink.summary.launches == 2
    assert s.stats.snapshot().get("requests_incomplete", 0) == 0


def test_a_seed_of_an_untracked_connection_known_by_its_inode_makes_it_tracked():
    """The audit learnt the untracked connection's socket; the seed once the table has
    room names that socket: from then on it is followed like any other."""
    s = new(Sockets({PID: {OTHER_FD: 101}}))
    s.process([untracked()])
    tick(s, T())  # the audit learns its inode
    s.process([seed(fd=OTHER_FD, inode=101)])
    assert (s.state()["conns"], s.state()["conns_untracked"]) == (1, 0)
    s.process([read(get(), fd=OTHER_FD), cuda()])
    (req,) = [r for r in s.process([write(OK, fd=OTHER_FD)]) if isinstance(r, Request)]
    assert req.sink.summary.launches == 1 and req.untracked_connections == 0


def test_a_seed_of_another_socket_on_the_fd_replaces_the_connection():
    """The fd is another socket than the one accepted (its close was never seen): the
    old connection's request ends as incomplete and the new one is followed."""
    s = new(Sockets())
    s.process([accept(inode=100), read(get())])
    (old,) = [r for r in s.process([seed(inode=101)]) if isinstance(r, Request)]
    assert old.error == "connection replaced"
    s.process([read(get("/infer/2")), cuda(tid=1)])
    (req,) = [r for r in s.process([write(OK)]) if isinstance(r, Request)]
    assert req.error is None and req.head.path == "/infer/2" and req.sink.summary.launches == 1


def test_tracked_connection_whose_close_was_lost_is_released_by_the_periodic_audit():
    sockets = Sockets({PID: {FD: 100}})
    s = new(sockets)
    now = T()
    s.process([accept()])
    tick(s, now)  # the first audit learns its socket
    sockets.by_pid[PID] = {}
    tick(s, now + AUDIT_ALL_NS // 2)  # tracked ones wait for the periodic audit
    assert s.state()["conns"] == 1
    tick(s, now + AUDIT_ALL_NS)
    assert s.state()["conns"] == 0 and s.stats.snapshot()["connection_closes_unseen"] == 1


def test_audit_leaves_a_connection_with_a_request_in_flight():
    s = new(Sockets({}))
    s.process([accept(), read(get())])
    tick(s, T())
    assert s.state()["conns"] == 1 and s.state()["open_requests"] == 1


# --- records lost (ring buffer full): the kernel counted those requests (RequestSummary)
def lost_read(raw: bytes, lost: int, fd=FD, tid=1, req_start=True):
    ev = read(raw, fd, tid)
    ev.lost, ev.req_start = lost, req_start
    return ev


def test_a_request_whose_response_records_were_lost_has_no_span_and_the_next_one_is_exact():
    """Its head was read, its response lost; the next request's read says so (lost=2)
    and starts a request: the first ends as records_lost, the second is parsed anew."""
    s = new(Sockets())
    out = s.process([accept(), read(get("/a")), cuda(), lost_read(get("/b"), 2), cuda(), cuda(), write(OK)])
    a, b = [r for r in out if isinstance(r, Request)]
    assert (a.head.path, a.records_lost) == ("/a", True)
    assert (b.head.path, b.records_lost, b.status, b.sink.summary.launches) == ("/b", False, 200, 2)
    assert s.stats.snapshot()["requests_records_lost"] == 1


def test_records_after_a_loss_are_ignored_until_a_read_starts_a_request():
    """A write that tells of a loss (its request's head was lost) and the reads that do
    not start a request are not parsed: no request is made of the middle of another."""
    s = new(Sockets())
    mid = write(OK)
    mid.lost = 1
    body = lost_read(b'{"x": 1}', 0, req_start=False)
    out = s.process([accept(), mid, body, lost_read(get("/c"), 0), write(OK)])
    (c,) = [r for r in out if isinstance(r, Request)]
    assert (c.head.path, c.records_lost, c.status) == ("/c", False, 200)


def test_a_span_open_while_its_process_lost_records_says_so():
    s = new(Sockets())
    out = s.process([accept(), accept(OTHER_FD), read(get("/a")), lost_read(get("/b"), 3, fd=OTHER_FD, tid=2),
                     write(OK)])
    a = next(r for r in out if isinstance(r, Request) and r.head.path == "/a")
    assert a.lost_while_open == 3 and not a.records_lost


def test_calls_made_while_records_went_unseen_are_ambiguous():
    """The kernel flags calls made while a connection's losses are untold: a request not
    seen may own them, so neither the thread nor the process rule decides."""
    s = new(Sockets())
    s.process([accept(), read(get())])
    flagged = cuda(tid=2)
    flagged.http_unseen = True
    s.process([flagged, cuda(tid=2)])
    out = s.process([write(OK), Tick(T())])
    (req,) = [r for r in out if isinstance(r, Request)]
    assert (req.sink.summary.launches, req.sink.summary.ambiguous) == (1, 1)
    assert s.by_rule["process.unseen"] == 1 and s.by_rule["process.one"] == 1
