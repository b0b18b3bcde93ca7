"""Handler threads of a multiplexed server (pipeline/handlers.py) through the stitcher:
gRPC pool threads, each in its own untracked context, several RPCs open on one HTTP/2
connection read by a poller thread. A call lands on an RPC only where provable; a
context address reused by another RPC, a write carrying two streams, or a binding
contradicted later leave the calls ambiguous, never on a wrong RPC."""
from otel_gpu.records import CudaCall, SockIo
from tests.unit.pipeline.protocols.http2.test_h2_stitcher import (PID, POLLER, launch, new, read, requests,
                                                                   write)
from tests.unit.pipeline.protocols.http2.h2_wire import PREFACE, Peer, data, grpc_message, grpc_request, settings

W1, W2 = 21, 22           # pool threads
X, Y = 0x7F00_0000_1E40, 0x7F00_0000_2280  # their contexts (never seen created)


def in_ctx(ev, ctx: int):
    if isinstance(ev, (SockIo, CudaCall)):
        ev.ctx = ctx
    return ev


def call(tid: int, ctx: int, rid: int):
    return in_ctx(launch(tid, rid), ctx)


def response(server: Peer, stream: int) -> bytes:
    return (server.headers(stream, [(":status", "200"), ("content-type", "application/grpc")])
            + data(stream, grpc_message()) + server.headers(stream, [("grpc-status", "0")], end_stream=True))


def opened(*streams: int):
    s, client, server = new(), Peer(), Peer()
    raw = PREFACE + settings()
    for n in streams:
        raw += client.headers(n, grpc_request()) + data(n, grpc_message(), True)
    s.process([read(raw)])
    return s, server


def grids(req) -> list:
    """(the RPC each call was made for, its attribution): launch() encodes it in the kernel."""
    return [(c.func - 0x1000, a) for c, a in req.sink.calls]


def test_each_pool_thread_writing_its_own_stream_alone_gets_its_calls():
    s, server = opened(1, 3)
    s.process([call(W1, X, 1), call(W2, Y, 3), call(W1, X, 1), call(W2, Y, 3)])
    assert s.attributed["ambiguous"] == 0 and s.state()["pending_calls"] == 4  # held, not guessed
    first = requests(s.process([in_ctx(write(response(server, 1), tid=W1), X)]))
    second = requests(s.process([in_ctx(write(response(server, 3), tid=W2), Y)]))
    assert [grids(r) for r in first + second] == [[(1, "task")] * 2, [(3, "task")] * 2]
    assert s.attributed["task"] == 4 and s.attributed["ambiguous"] == 0 and s.state()["pending_calls"] == 0


def test_a_reused_context_address_never_hands_an_earlier_rpcs_calls_to_the_next():
    # RPC 1's handler ran in X on W1 but C-core wrote its response from the poller (ctx 0);
    # X's address then served RPC 3 on the same thread, which wrote its own frames.
    s, server = opened(1, 3)
    s.process([call(W1, X, 1)])
    [one] = requests(s.process([write(response(server, 1))]))
    s.process([call(W1, X, 3)])  # one RPC open: the process rule, as before
    [three] = requests(s.process([in_ctx(write(response(server, 3), tid=W1), X)]))
    assert grids(one) == [] and grids(three) == [(3, "process")]
    assert s.attributed["ambiguous"] == 1 and s.attributed["task"] == 0
    assert one.sink.summary.ambiguous + three.sink.summary.ambiguous == 1


def test_an_rpc_still_unbound_when_its_peer_finishes_does_not_block_a_provable_call():
    s, server = opened(1, 3, 5)
    s.process([call(W1, X, 1)])
    [one] = requests(s.process([in_ctx(write(response(server, 1), tid=W1), X)]))
    assert grids(one) == [(1, "task")]  # 3 and 5 are open, so were not freed before W1's write


def test_a_write_carrying_two_streams_binds_nobody():
    s, server = opened(1, 3)
    s.process([call(W1, X, 1)])
    done = requests(s.process([in_ctx(write(response(server, 1) + response(server, 3), tid=W1), X)]))
    assert len(done) == 2 and all(grids(r) == [] for r in done)
    assert s.attributed["ambiguous"] == 1 and s.attributed["task"] == 0


def test_a_bound_thread_writing_another_streams_frames_voids_its_binding():
    s, server = opened(1, 3)
    s.process([call(W1, X, 1)])
    s.process([in_ctx(write(server.headers(1, [(":status", "200")]) + data(1, grpc_message()), tid=W1), X)])
    s.process([in_ctx(write(response(server, 3), tid=W1), X)])  # C-core wrote 3's frames from W1
    [one] = requests(s.process([write(server.headers(1, [("grpc-status", "0")], end_stream=True))]))
    assert grids(one) == [] and s.attributed["ambiguous"] == 1
    assert s.stats.snapshot()["handler_binding_conflicts"] == 1


def test_two_threads_writing_one_stream_alone_void_its_binding():
    s, server = opened(1, 3)
    s.process([call(W1, X, 1)])
    s.process([in_ctx(write(server.headers(1, [(":status", "200")]), tid=W1), X),
               in_ctx(write(data(1, grpc_message()), tid=W2), Y)])
    [one] = requests(s.process([write(server.headers(1, [("grpc-status", "0")], end_stream=True))]))
    assert grids(one) == [] and s.attributed["ambiguous"] == 1


def test_calls_of_a_pair_that_never_binds_are_ambiguous_once_every_candidate_finished():
    s, server = opened(1, 3)
    s.process([call(W1, X, 1)])
    out = s.process([write(response(server, 1)), write(response(server, 3))])  # all from C-core threads
    assert all(grids(r) == [] for r in requests(out))
    assert s.attributed["ambiguous"] == 1
    assert s.procs[PID].holds.held == 0 and s.procs[PID].holds.index == {}


def test_past_the_cap_calls_are_ambiguous_at_once_and_counted():
    s, server = opened(1, 3)
    s.procs[PID].holds.max_held = 1
    s.process([call(W1, X, 1), call(W1, X, 1)])
    assert s.attributed["ambiguous"] == 1
    assert s.stats.snapshot()["held_calls_overflow"] == 1 and s.by_rule["process.held_full"] == 1


def test_calls_on_the_reading_thread_or_without_a_context_are_not_held():
    s, server = opened(1, 3)
    s.process([call(POLLER, X, 1), launch(W1, 1)])
    assert s.attributed["ambiguous"] == 2 and s.procs[PID].holds.held == 0
