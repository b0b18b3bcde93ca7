"""HTTP/2 and gRPC through the stitcher: one request per stream on one connection, CUDA
calls attributed by the existing rules (one reading thread, several streams open: never
`thread` on a guess), resets and dropped connections counted."""
import random

from otel_gpu.pipeline.model import Request
from otel_gpu.pipeline.records import EV_SOCK_READ, EV_SOCK_WRITE, Accept, SockClose, SockIo
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline import calls
from tests.unit.pipeline.protocols.http2.h2_wire import (PREFACE, Peer, data, get, grpc_message, grpc_request, rst,
                                                         settings)

PID, FD, POLLER, WORKER, OTHER_WORKER = 4242, 10, 1, 2, 3
_t = [1_000_000]


def T():
    _t[0] += 1000
    return _t[0]


def read(raw: bytes, tid=POLLER):
    return SockIo(EV_SOCK_READ, PID, tid, T(), FD, len(raw), raw[:1024], b"")


def write(raw: bytes, tid=POLLER):
    return SockIo(EV_SOCK_WRITE, PID, tid, T(), FD, len(raw), raw[:1024], raw[-8:])


def launch(tid, grid_x):
    return calls.cuda("cudaLaunchKernel", tid, 0x1000 + grid_x, 0, 0, PID, 0, ts=T())


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
