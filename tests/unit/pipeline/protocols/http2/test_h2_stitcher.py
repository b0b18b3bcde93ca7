"""HTTP/2 and gRPC through the stitcher: one request per stream on one connection, CUDA
calls attributed by the existing rules (one reading thread, several streams open: never
`thread` on a guess), resets and dropped connections counted."""
import random

import pytest

from otel_gpu.pipeline.model import Request
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, Accept, ContextCopy, SockClose, SockIo
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline import calls
from tests.unit.pipeline.protocols.http2.h2_wire import (PREFACE, Peer, data, get, grpc_message, grpc_request, rst,
                                                         settings)

PID, FD, POLLER, WORKER, OTHER_WORKER = 4242, 10, 1, 2, 3
_t = [1_000_000]


def T():
    _t[0] += 1000
    return _t[0]


def read(raw: bytes, tid=POLLER, ctx=0):
    return SockIo(EV_SOCK_READ, PID, tid, T(), FD, len(raw), raw[:1024], b"", ctx)


def write(raw: bytes, tid=POLLER, ctx=0):
    return SockIo(EV_SOCK_WRITE, PID, tid, T(), FD, len(raw), raw[:1024], raw[-8:], ctx)


def launch(tid, grid_x, ctx=0):
    return calls.cuda("cudaLaunchKernel", tid, 0x1000 + grid_x, 0, 0, PID, 0, ts=T(), ctx=ctx)


def new():
    s = Stitcher(span_budget=256, rng=random.Random(7))
    s.process([Accept(PID, POLLER, T(), FD, 3, "10.0.0.9", 40000)])
    return s


def requests(out):
    return [r for r in out if isinstance(r, Request)]


def test_streams_on_one_connection_each_get_a_request_with_their_status():
    s, client, server = new(), Peer(), Peer()
    out = s.process([read(PREFACE + settings() + client.headers(1, get("/a"), end_stream=True)
                          + client.headers(3, get("/b"), end_stream=True))])
    assert requests(out) == []
    out = s.process([write(server.headers(3, [(":status", "404")], end_stream=True)),
                     write(server.headers(1, [(":status", "200")]) + data(1, b"ok", end_stream=True))])
    done = requests(out)
    assert [(r.head.path, r.status, r.error, r.head.protocol) for r in done] == [
        ("/b", 404, None, "h2"), ("/a", 200, None, "h2")]
    assert all(r.tid == POLLER and r.peer_addr == "10.0.0.9" for r in done)


def test_one_rpc_open_calls_on_a_pool_thread_are_process():
    s, client, server = new(), Peer(), Peer()
    s.process([read(PREFACE + settings() + client.headers(1, grpc_request()) + data(1, grpc_message(), True))])
    s.process([launch(WORKER, 1), launch(WORKER, 1)])
    out = s.process([write(server.headers(1, [(":status", "200"), ("content-type", "application/grpc")])
                           + data(1, grpc_message()) + server.headers(1, [("grpc-status", "0")], end_stream=True))])
    [r] = requests(out)
    assert r.head.rpc == {"system": "grpc", "service": "demo.Inference", "method": "Predict", "status_code": 0}
    assert [a for _, a in r.sink.calls] == ["process", "process"]


def test_several_rpcs_open_calls_off_the_reading_thread_are_ambiguous_never_guessed():
    s, client, server = new(), Peer(), Peer()
    s.process([read(PREFACE + settings() + client.headers(1, grpc_request()) + data(1, grpc_message(), True)
                    + client.headers(3, grpc_request()) + data(3, grpc_message(), True))])
    s.process([launch(WORKER, 1), launch(OTHER_WORKER, 3)])
    out = s.process([write(server.headers(1, [(":status", "200"), ("grpc-status", "0")], end_stream=True)),
                     write(server.headers(3, [(":status", "200"), ("grpc-status", "0")], end_stream=True))])
    done = requests(out)
    assert len(done) == 2 and all(r.sink.calls == [] for r in done)
    assert s.attributed["ambiguous"] == 2 and s.attributed["thread"] == s.attributed["process"] == 0


def test_several_streams_read_by_one_thread_never_give_thread_attribution():
    s, client = new(), Peer()
    s.process([read(PREFACE + settings() + client.headers(1, get("/a"), end_stream=True)
                    + client.headers(3, get("/b"), end_stream=True))])
    s.process([launch(POLLER, 1)])
    assert s.attributed["thread"] == 0 and s.attributed["ambiguous"] == 1


def test_reset_stream_is_an_incomplete_request_and_others_go_on():
    s, client, server = new(), Peer(), Peer()
    s.process([read(PREFACE + settings() + client.headers(1, get("/a"), end_stream=True)
                    + client.headers(3, get("/b"), end_stream=True))])
    [reset] = requests(s.process([read(rst(3))]))
    assert reset.head.path == "/b" and reset.error == "reset by the client"
    [ok] = requests(s.process([write(server.headers(1, [(":status", "200")], end_stream=True))]))
    assert ok.head.path == "/a" and ok.error is None
    assert s.stats.snapshot().get("requests_incomplete") == 1


def test_hpack_loss_drops_the_connection_counted_and_its_open_streams_end_in_error():
    s, client = new(), Peer()
    s.process([read(PREFACE + settings() + client.headers(1, get("/a"), end_stream=True))])
    out = s.process([read(client.headers(3, get("/b", extra=(("x-pad", "p" * 3000),)), end_stream=True))])
    [dropped] = requests(out)
    assert dropped.head.path == "/a" and dropped.error
    assert s.stats.snapshot()["h2_hpack_lost"] == 1
    assert requests(s.process([read(client.headers(5, get("/c"), end_stream=True)),
                               SockClose(PID, POLLER, T(), FD)])) == []


# An asyncio HTTP/2 server as hypercorn is (measured, tests/bpf/test_http2.py): the
# connection's reader task reads every stream's HEADERS, a task per stream (a copy of
# the reader's context) runs the app and writes that stream's response HEADERS itself;
# a per-connection send task, made by the same read, writes the DATA of every stream.
READER, SENDER, TASK1, TASK3 = 0x7000, 0x7100, 0x7201, 0x7203


def _asyncio_h2(request=get, task_parent=READER):
    """Two streams read by the reader task; the send task and the stream tasks (copies
    of `task_parent`'s context) made after that read, so all newer than both streams;
    one launch in each stream task (func = 0x1000 + its stream id), one in the send task."""
    s, client = new(), Peer()
    s.process([ContextCopy(PID, POLLER, T(), READER, 0)])
    s.process([read(PREFACE + settings() + client.headers(1, request(), end_stream=True)
                    + client.headers(3, request(), end_stream=True), ctx=READER)])
    s.process([ContextCopy(PID, POLLER, T(), SENDER, READER), ContextCopy(PID, POLLER, T(), TASK1, task_parent),
               ContextCopy(PID, POLLER, T(), TASK3, task_parent)])
    s.process([launch(POLLER, 1, TASK1), launch(POLLER, 3, TASK3), launch(POLLER, 9, SENDER)])
    return s


def _launches(r):
    """(stream task's launch: its stream id, attribution) of a request's calls."""
    return sorted((ev.func - 0x1000, a) for ev, a in r.sink.calls)


@pytest.mark.parametrize("task_parent", [READER, SENDER])
def test_a_stream_task_writing_its_response_headers_alone_gets_its_calls(task_parent):
    """With SENDER as the stream tasks' parent (a per-connection task made by the read
    that opened the streams, so newer than both): binding a stream to its task must not
    bind that parent too, or the other stream's task would inherit the binding."""
    s, server = _asyncio_h2(task_parent=task_parent), Peer()
    out = s.process([write(server.headers(3, [(":status", "200")]), ctx=TASK3),
                     write(data(3, b"three", end_stream=True), ctx=SENDER),
                     write(server.headers(1, [(":status", "200")]), ctx=TASK1),
                     write(data(1, b"one", end_stream=True), ctx=SENDER)])
    assert [_launches(r) for r in requests(out)] == [[(3, "task")], [(1, "task")]]
    # The send task wrote DATA of both streams and was made by the read that opened them
    # (newer than both): never bound. Both streams bound their own tasks, neither of
    # which it descends from: its launch is no request's (pipeline/contexts.py).
    assert s.attributed["task"] == 2 and s.attributed["outside"] == 1 and s.attributed["ambiguous"] == 0


def test_a_write_with_two_streams_response_headers_binds_neither():
    s, server = _asyncio_h2(), Peer()
    out = s.process([write(server.headers(1, [(":status", "200")]) + server.headers(3, [(":status", "200")]),
                           ctx=TASK1),
                     write(data(1, end_stream=True) + data(3, end_stream=True), ctx=SENDER)])
    assert [r.sink.calls for r in requests(out)] == [[], []]
    assert s.attributed["task"] == 0 and s.attributed["ambiguous"] == 3


def test_a_task_writing_data_alone_does_not_bind_only_response_headers_do():
    s, server = _asyncio_h2(), Peer()
    out = s.process([write(server.headers(1, [(":status", "200")]) + server.headers(3, [(":status", "200")]),
                           ctx=READER),
                     write(data(1, b"one", end_stream=True), ctx=TASK1),
                     write(data(3, b"three", end_stream=True), ctx=READER)])
    assert [r.sink.calls for r in requests(out)] == [[], []]
    assert s.attributed["task"] == 0 and s.attributed["ambiguous"] == 3


def test_grpc_streams_are_not_bound_by_the_writing_context():
    """C-core writes whatever frames are queued from whichever thread holds its combiner:
    a write's context does not prove whose stream it carries (pipeline/handlers.py)."""
    s, server = _asyncio_h2(grpc_request), Peer()
    out = s.process([write(server.headers(3, [(":status", "200"), ("grpc-status", "0")], end_stream=True),
                           ctx=TASK3),
                     write(server.headers(1, [(":status", "200"), ("grpc-status", "0")], end_stream=True),
                           ctx=READER)])
    assert [r.sink.calls for r in requests(out)] == [[], []]
    assert s.attributed["task"] == 0 and s.attributed["ambiguous"] == 3


def test_one_rpc_open_a_write_from_its_task_binds_it():
    """gRPC keeps the one-request rule (as HTTP/1): an asyncio server's task for the only
    open RPC (grpc.aio) writes through C-core in its own context."""
    s, client, server = new(), Peer(), Peer()
    s.process([ContextCopy(PID, POLLER, T(), READER, 0)])
    s.process([read(PREFACE + settings() + client.headers(1, grpc_request()) + data(1, grpc_message(), True),
                    ctx=READER)])
    s.process([ContextCopy(PID, POLLER, T(), TASK1, READER), launch(POLLER, 1, TASK1)])
    out = s.process([write(server.headers(1, [(":status", "200"), ("grpc-status", "0")], end_stream=True),
                           ctx=TASK1)])
    [r] = requests(out)
    assert _launches(r) == [(1, "task")]


def test_calls_while_an_unfollowed_http2_connection_is_open_are_ambiguous_never_outside():
    """A connection whose framing was lost (here the kernel's walk stopped) carries
    requests no span will show: the process's calls cannot be outside every request, nor
    its one visible request's, until that connection closes."""
    from otel_gpu.kernel_io.abi import H2_STOP_ROOM
    from otel_gpu.records import H2Digest
    s, client = new(), Peer()
    s.process([Accept(PID, POLLER, T(), FD + 1, 3, "10.0.0.9", 40001)])
    raw = PREFACE + settings() + client.headers(1, get("/seen"), end_stream=True)
    s.process([read(raw)])  # FD: one request open
    hello = PREFACE + settings()
    lost = SockIo(EV_SOCK_READ, PID, POLLER, T(), FD + 1, 90_000, hello, b"", 0,
                  digest=H2Digest(((0, hello),), stop=H2_STOP_ROOM))
    s.process([lost])  # FD + 1: dropped, its requests unseen
    assert s.stats.snapshot()["h2_walk_room"] == 1
    s.process([launch(WORKER, 7)])  # process.one would decide: an unseen request may own it
    assert s.by_rule["process.unfollowed"] == 1 and s.attributed["process"] == 0
    out = s.process([write(Peer().headers(1, [(":status", "200")], end_stream=True))])
    assert [r.sink.calls for r in requests(out)] == [[]]
    s.process([launch(WORKER, 8)])  # no request open, one may be on the lost connection
    assert s.by_rule["process.unfollowed"] == 2 and s.attributed["outside"] == 0
    s.process([SockClose(PID, POLLER, T(), FD + 1)])
    s.process([launch(WORKER, 9)])  # gone with it
    assert s.by_rule["process.idle"] == 1 and s.attributed["outside"] == 1


@pytest.mark.parametrize("reply", [b"HTTP/1.1 505 HTTP Version Not Supported\r\n\r\n",
                                   b"<!DOCTYPE HTML>\n<html lang=\"en\"><head>Error response</head></html>\n"])
def test_a_server_that_never_answers_in_http2_hides_no_requests(reply):
    """An HTTP/1 server given HTTP/2's preface answers in HTTP/1 (Python's http.server: a
    505 page, without a status line): its first bytes are no HTTP/2 frame, so no request
    can go on unseen on that connection. It is dropped and counted, and while it stays
    open (the server's close can come after the client's next request) the process's
    calls are attributed as they would be without it."""
    s = new()
    s.process([read(PREFACE + settings())])
    s.process([write(reply)])
    assert s.stats.snapshot()["h2_parse_errors"] == 1
    s.process([launch(WORKER, 7)])  # no request open, none can be hidden
    assert s.by_rule["process.unfollowed"] == 0 and s.attributed["outside"] == 1


def test_a_server_that_spoke_http2_then_lost_its_framing_still_hides():
    """The same bytes after a frame the server did send: framing lost, not a server that
    never spoke HTTP/2. Its requests may go on unseen: the calls are ambiguous."""
    s = new()
    s.process([read(PREFACE + settings())])
    s.process([write(settings())])
    s.process([write(b"<!DOCTYPE HTML>\n")])
    assert s.stats.snapshot()["h2_parse_errors"] == 1
    s.process([launch(WORKER, 7)])
    assert s.by_rule["process.unfollowed"] == 1 and s.attributed["outside"] == 0


def test_a_digest_on_a_connection_user_space_follows_as_http1_drops_it_counted():
    """The kernel walks a connection as HTTP/2 that user space follows as HTTP/1 (never
    expected: both decide from the same bytes): the connection is dropped, logged and
    counted, its request ended with an error, never parsed from a digest as bytes."""
    from otel_gpu.records import H2Digest
    s = new()
    s.process([read(b"GET /a HTTP/1.1\r\nHost: x\r\n\r\n")])
    frames = settings()
    out = s.process([SockIo(EV_SOCK_READ, PID, POLLER, T(), FD, len(frames), frames, b"", 0,
                            digest=H2Digest(((0, frames),)))])
    [r] = requests(out)
    assert r.error == "malformed HTTP/2" and s.stats.snapshot()["h2_digest_unexpected"] == 1
