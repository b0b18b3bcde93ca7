"""Go HTTP/2 handler goroutines (pipeline/go_h2.py) through the stitcher: a connection
read by its serverConn's reader goroutine, streams whose handlers the server started in
goroutines of their own (GoH2Unit records). Each handler's calls land on its stream's
request, whatever order the records come in; a handler whose stream is gone binds
nothing; without the records, the calls stay ambiguous (never guessed)."""
from otel_gpu.kernel_io.abi import GO_UNIT
from otel_gpu.records import ContextCopy, GoH2Unit
from tests.unit.pipeline.protocols.http2.h2_wire import PREFACE, Peer, data, get, settings
from tests.unit.pipeline.protocols.http2.test_h2_stitcher import PID, POLLER, T, launch, new, read, requests, write

SERVE, READER = GO_UNIT | 1, GO_UNIT | 2  # the connection's serve loop and its frame reader
SC = 0xC000_1000  # the *serverConn


def handler(stream: int) -> int:
    return GO_UNIT | (100 + stream)


def began(unit: int, stream: int = 0, conn: int = SC) -> GoH2Unit:
    return GoH2Unit(PID, POLLER, T(), unit, conn, stream)


def spawn(unit: int, parent: int = SERVE) -> ContextCopy:
    return ContextCopy(PID, POLLER, T(), unit, parent)


def heads(client: Peer, *streams: int) -> bytes:
    return b"".join(client.headers(n, get(f"/r/{n}"), end_stream=True) for n in streams)


def answer(server: Peer, stream: int, unit: int):
    return write(server.headers(stream, [(":status", "200")]) + data(stream, b"ok", end_stream=True), ctx=unit)


def call(stream: int):
    """A launch in stream's handler goroutine, its grid encoding the stream."""
    return launch(POLLER, stream, ctx=handler(stream))


def owners(req) -> list:
    return [(c.func - 0x1000, a) for c, a in req.sink.calls]


def test_each_handler_goroutines_calls_land_on_its_stream():
    s, client, server = new(), Peer(), Peer()
    s.process([began(READER), read(PREFACE + settings() + heads(client, 1, 3, 5), ctx=READER)])
    s.process([spawn(handler(n)) for n in (1, 3, 5)] + [began(handler(n), n) for n in (5, 1, 3)])
    s.process([call(3), call(1), call(5), call(3)])
    done = requests(s.process([answer(server, n, SERVE) for n in (3, 5, 1)]))
    assert {r.head.path: owners(r) for r in done} == {
        "/r/3": [(3, "task"), (3, "task")], "/r/5": [(5, "task")], "/r/1": [(1, "task")]}
    assert s.by_rule["unit.bound_later"] + s.by_rule["unit.bound"] == 4 and s.attributed["ambiguous"] == 0


def test_records_out_of_order_still_bind_each_handler_to_its_own_stream():
    """Handler records come before their connection's reader is known, and before the read
    that opened their streams; the reader's record comes after its reads."""
    s, client, server = new(), Peer(), Peer()
    opening = read(PREFACE + settings() + heads(client, 1, 3), ctx=READER)
    reader = began(READER)
    early = [spawn(handler(n)) for n in (1, 3)] + [began(handler(3), 3), began(handler(1), 1)]
    s.process(early + [opening])
    s.process([call(1), call(3)])  # held: the handlers' connection is not known yet
    assert s.attributed["task"] == 0 and s.state()["pending_calls"] == 2
    s.process([reader, read(data(1), ctx=READER)])
    s.process([call(3)])
    done = requests(s.process([answer(server, 1, SERVE), answer(server, 3, SERVE)]))
    assert {r.head.path: owners(r) for r in done} == {"/r/1": [(1, "task")], "/r/3": [(3, "task"), (3, "task")]}


def test_a_handler_whose_stream_came_and_went_binds_nothing():
    s, client, server = new(), Peer(), Peer()
    s.process([began(READER), read(PREFACE + settings() + heads(client, 1, 3), ctx=READER)])
    requests(s.process([answer(server, 1, SERVE)]))
    s.process([began(handler(1), 1), call(1)])  # stream 1 is over: its handler is late
    [three] = requests(s.process([answer(server, 3, SERVE)]))
    assert owners(three) == [] and s.stats.snapshot()["go_h2_handlers_late"] == 1
    assert s.attributed["task"] == 0


def test_without_the_handler_records_calls_stay_ambiguous():
    s, client, server = new(), Peer(), Peer()
    s.process([read(PREFACE + settings() + heads(client, 1, 3), ctx=READER)])
    s.process([spawn(handler(n)) for n in (1, 3)] + [call(1), call(3)])
    done = requests(s.process([answer(server, 1, SERVE), answer(server, 3, SERVE)]))
    assert all(owners(r) == [] for r in done) and s.attributed["ambiguous"] == 2


def test_a_closed_connection_forgets_its_server_so_a_reused_address_starts_afresh():
    s, client = new(), Peer()
    s.process([began(READER), read(PREFACE + settings() + heads(client, 1), ctx=READER)])
    p = s.procs[PID]
    (c,) = p.conns.values()
    assert c.go_h2_server == SC and p.go_h2.conns == {SC: c}
    s.http.drop_conn(p, c, T(), "test", [])
    assert p.go_h2.conns == {} and p.go_h2.pending == {}
