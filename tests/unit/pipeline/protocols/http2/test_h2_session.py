"""The HTTP/2 session over real HPACK bytes: streams, multiplexing, gRPC, resets,
frames split or cut by the probe's 1 KiB copy, and bad input (counted drops)."""
import hpack

from otel_gpu.pipeline.protocols.base import (ProtocolError, RequestFinished, RequestStarted, ResponseStatus,
                                              SessionConfig, StreamReset)
from otel_gpu.pipeline.protocols.http2 import PROTOCOL
from otel_gpu.pipeline.protocols.http2.frames import HEADERS, PING, PRIORITY, WINDOW_UPDATE
from otel_gpu.pipeline.protocols.http2.session import H2Session
from tests.unit.pipeline.protocols.http2.h2_wire import (PREFACE, Peer, data, frame, get, goaway, grpc_message,
                                                         grpc_request, rst, settings)

CAP = 1024  # what the probe copies of one read or write


def read(s, raw: bytes, ts: int = 1, tid: int = 7):
    return s.on_read(raw[:CAP], len(raw), ts, tid)


def write(s, raw: bytes, ts: int = 2, tid: int = 8):
    return s.on_write(raw[:CAP], len(raw), raw[-64:], ts, tid)


def h2(config=SessionConfig()):
    """A session whose server already sent its preface (a SETTINGS frame)."""
    s = H2Session(config)
    assert write(s, settings()) == []
    return s


def of(events, kind):
    return [e for e in events if isinstance(e, kind)]


def test_detect_prior_knowledge_preface():
    assert PROTOCOL.detect(PREFACE) is True
    assert PROTOCOL.detect(PREFACE[:10]) is None
    assert PROTOCOL.detect(b"GET / HTTP/1.1\r\n") is False
    assert PROTOCOL.detect(b"PRI * HTTP/1.1\r\n") is False


def test_one_stream_request_status_and_end():
    s, client, server = h2(SessionConfig(frozenset({"x-model"}))), Peer(), Peer()
    ev = read(s, PREFACE + settings() + client.headers(
        1, get(extra=(("x-model", "m1"), ("authorization", "secret"), ("traceparent", "00-ab-cd-01"))),
        end_stream=True), ts=10, tid=42)
    [started] = ev
    assert isinstance(started, RequestStarted)
    assert (started.stream, started.start_ns, started.tid) == (1, 10, 42)
    h = started.head
    assert (h.method, h.target, h.protocol, h.version, h.rpc) == ("GET", "/infer/1", "h2", "2", None)
    assert h.headers == {"host": "127.0.0.1:8000", "x-model": "m1", "traceparent": "00-ab-cd-01"}
    assert write(s, frame(PING, 0, 0, b"\0" * 8)) == []
    ev = write(s, server.headers(1, [(":status", "404"), ("content-type", "text/plain")]), ts=20)
    assert ev == [ResponseStatus(1, 404)]
    assert write(s, data(1, b"nope", end_stream=True), ts=30) == [RequestFinished(1, 30, 404, None)]


def test_multiplexed_streams_finish_in_any_order_and_dynamic_table_is_followed():
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings())
    started = []
    for n, stream in enumerate((1, 3, 5)):  # the same fields again: indexed from the dynamic table
        started += of(read(s, client.headers(stream, get(f"/infer/{n}", extra=(("user-agent", "t"),)),
                                             end_stream=True)), RequestStarted)
    assert [(e.stream, e.head.target) for e in started] == [(1, "/infer/0"), (3, "/infer/1"), (5, "/infer/2")]
    out = write(s, server.headers(5, [(":status", "200")]) + server.headers(1, [(":status", "500")])
                + data(5, b"x", end_stream=True) + server.headers(3, [(":status", "200")], end_stream=True)
                + data(1, b"", end_stream=True), ts=9)
    assert of(out, RequestFinished) == [RequestFinished(5, 9, 200), RequestFinished(3, 9, 200),
                                        RequestFinished(1, 9, 500)]


def test_frames_split_across_reads_byte_by_byte_and_continuation():
    s, client = h2(), Peer()
    before = PREFACE + settings() + frame(WINDOW_UPDATE, 0, 0, b"\0\0\x10\0") + frame(PRIORITY, 0, 3, b"\0" * 5)
    raw = before + client.headers(1, get("/a/very/long/path"), end_stream=True, split=5)
    events = []
    for i, b in enumerate(raw):
        events += read(s, bytes([b]), ts=100 + i)
    [e] = events
    assert isinstance(e, RequestStarted) and e.head.target == "/a/very/long/path"
    first_frame_done = len(before) + 9 + 5 - 1  # HEADERS carries 5 block bytes, CONTINUATION the rest
    assert e.start_ns == 100 + first_frame_done  # the read that completed the HEADERS frame


def test_start_time_is_the_first_header_frame_read():
    s, client = h2(), Peer()
    read(s, PREFACE + settings())
    wire = client.headers(1, get(), split=3)
    first, second = wire[:14], wire[14:]
    assert read(s, first, ts=50) == []
    [e] = read(s, second, ts=60)
    assert e.start_ns == 50


def test_large_data_frame_past_the_copy_is_skipped_by_its_length():
    s, client = h2(), Peer()
    read(s, PREFACE + settings() + client.headers(1, [(":method", "POST"), (":path", "/upload")]))
    body = data(1, b"z" * 5000, end_stream=True)
    assert read(s, body) == []  # 1 KiB copied of 5009 bytes: the frame ends with the read
    [e] = read(s, client.headers(3, get("/next"), end_stream=True))
    assert e.head.target == "/next"


def test_data_frame_spanning_reads_past_the_copy_each_time():
    s, client = h2(), Peer()
    read(s, PREFACE + settings() + client.headers(1, [(":method", "POST"), (":path", "/u")]))
    body = data(1, b"z" * 9000, end_stream=True)
    assert read(s, body[:3000]) == []
    assert read(s, body[3000:7000]) == []
    assert read(s, body[7000:]) == []
    [e] = read(s, client.headers(3, get("/after"), end_stream=True))
    assert e.head.target == "/after"


def test_frames_after_the_uncopied_bytes_lose_framing_and_drop_the_connection():
    s, client = h2(), Peer()
    read(s, PREFACE + settings())
    raw = client.headers(1, [(":method", "POST"), (":path", "/u")]) + data(1, b"z" * 2000) \
        + client.headers(3, get("/hidden"), end_stream=True)
    started, e = read(s, raw)  # the request before the fault still opens (the stitcher ends it in error)
    assert isinstance(started, RequestStarted) and started.stream == 1
    assert isinstance(e, ProtocolError) and e.counter == "h2_parse_errors"
    assert "past the probe's copy" in e.message
    assert read(s, client.headers(5, get(), end_stream=True)) == []  # ignored from then on


def test_header_block_cut_by_the_copy_loses_hpack_state():
    s, client = h2(), Peer()
    read(s, PREFACE + settings())
    big = client.headers(1, get(extra=(("x-pad", "p" * 3000),)), end_stream=True)
    [e] = read(s, big)
    assert isinstance(e, ProtocolError) and e.counter == "h2_hpack_lost"
    assert "p" * 10 not in e.message


def test_decoded_header_list_past_64_kib_is_dropped():
    s = h2()
    read(s, PREFACE + settings())
    block = hpack.Encoder().encode(get(extra=(("x-big", "b" * 70000),)))  # Huffman: under 64 KiB on the wire
    assert len(block) < 64 * 1024
    pieces = [frame(HEADERS, 0, 1, block[:900])] + [
        frame(0x9, 0x4 if i + 900 >= len(block) else 0, 1, block[i:i + 900]) for i in range(900, len(block), 900)]
    events = [e for p in pieces for e in read(s, p)]
    [e] = events
    assert e.counter == "h2_hpack_lost" and "Oversized" in e.message


def test_server_max_frame_size_setting_bounds_client_frames_once_seen():
    """Unseen (written before the first read), the client's frames may be as large as
    the protocol allows; seen, its value holds."""
    s, client = H2Session(), Peer()
    read(s, PREFACE + settings() + client.headers(1, [(":method", "POST"), (":path", "/u")]))
    assert read(s, data(1, b"z" * 40000, end_stream=True)) == []
    [e] = read(s, client.headers(3, get(), end_stream=True))
    assert isinstance(e, RequestStarted)
    write(s, frame(0x4, 0, 0, (5).to_bytes(2, "big") + (20000).to_bytes(4, "big")))
    [e] = read(s, data(3, b"z" * 30000))
    assert isinstance(e, ProtocolError) and "over the 20000 allowed" in e.message


def test_hpack_error_is_counted_and_never_a_request():
    s = h2()
    read(s, PREFACE + settings())
    [e] = read(s, frame(HEADERS, 0x5, 1, b"\xff\xff\xff\xff\xff"))  # index far past any table
    assert isinstance(e, ProtocolError) and e.counter == "h2_hpack_lost"


def test_oversized_header_block_is_dropped():
    s = h2()
    read(s, PREFACE + settings())
    block = hpack.Encoder().encode(get(extra=(("x-big", "~" * 70000),)))  # no Huffman gain: sent raw
    pieces = [frame(HEADERS, 0, 1, block[:900])] + [
        frame(0x9, 0x4 if i + 900 >= len(block) else 0, 1, block[i:i + 900]) for i in range(900, len(block), 900)]
    events = []
    for p in pieces:
        events += read(s, p)
    [e] = events
    assert isinstance(e, ProtocolError) and "larger than 64 KiB" in e.message


def test_garbage_after_the_preface_and_a_wrong_preface():
    s = h2()
    [e] = read(s, PREFACE + b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03\x03" + b"\0" * 40)
    assert isinstance(e, ProtocolError) and "not SETTINGS" in e.message
    [e] = read(h2(), PREFACE + settings() + frame(PING, 0, 0, b"\0" * 7))
    assert "payload of 7 bytes" in e.message
    [e] = write(h2(), frame(0x0, 0x0, 1, b"x" * 20000)[:9])  # the client's SETTINGS did not raise 16384
    assert "over the 16384 allowed" in e.message
    [e] = read(h2(), PREFACE + settings() + frame(0x0, 0x1, 0, b""))
    assert "type 0 on stream 0" in e.message
    [e] = read(H2Session(), b"PRI * HTTP/2.0\r\n\r\nXX\r\n\r\n")
    assert isinstance(e, ProtocolError) and "preface" in e.message
    [e] = read(H2Session(), PREFACE + settings() + frame(HEADERS, 0x5, 2, b"\x82"))
    assert "even stream" in e.message


def test_client_reset_and_server_reset_end_streams_with_a_reason():
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings() + client.headers(1, get(), end_stream=True) + client.headers(3, get()))
    assert read(s, rst(3), ts=5) == [StreamReset(3, 5, "reset by the client")]
    assert write(s, server.headers(1, [(":status", "200")]) + rst(1), ts=6) == [
        ResponseStatus(1, 200), StreamReset(1, 6, "reset by the server")]
    assert write(s, data(1, b"late", end_stream=True)) == []  # no stream left to finish


def test_goaway_ends_streams_past_its_last_stream_only():
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings())
    for stream in (1, 3, 5):
        read(s, client.headers(stream, get(), end_stream=True))
    assert write(s, goaway(3), ts=7) == [StreamReset(5, 7, "GOAWAY from the server")]
    assert of(write(s, server.headers(3, [(":status", "200")], end_stream=True)), RequestFinished) == [
        RequestFinished(3, 2, 200)]


def test_half_closed_stream_then_response():
    """The client ends its side with DATA END_STREAM (half-closed remote); the response
    still finishes the stream; a second END_STREAM from the client changes nothing."""
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings() + client.headers(1, [(":method", "POST"), (":path", "/p")]))
    assert read(s, data(1, b"body", end_stream=True)) == []
    assert read(s, data(1, b"", end_stream=True)) == []
    out = write(s, server.headers(1, [(":status", "201")], end_stream=True))
    assert of(out, RequestFinished) == [RequestFinished(1, 2, 201)]


def test_interim_status_then_final():
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings() + client.headers(1, get()))
    assert write(s, server.headers(1, [(":status", "100")])) == []
    assert write(s, server.headers(1, [(":status", "200")], end_stream=True))[-1] == RequestFinished(1, 2, 200)


def test_response_without_status_is_a_protocol_error():
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings() + client.headers(1, get()))
    [e] = write(s, server.headers(1, [("content-type", "text/plain")]))
    assert isinstance(e, ProtocolError)


def test_grpc_unary_ok_and_error_status_from_trailers():
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings())
    [ok] = read(s, client.headers(1, grpc_request()) + data(1, grpc_message(), end_stream=True))
    [bad] = read(s, client.headers(3, grpc_request("demo.Inference", "Fail")) + data(3, grpc_message(), True))
    assert ok.head.protocol == "grpc" and ok.head.method == "POST"
    assert ok.head.rpc == {"system": "grpc", "service": "demo.Inference", "method": "Predict", "status_code": None}
    ok_resp = server.headers(1, [(":status", "200"), ("content-type", "application/grpc")]) + data(1, grpc_message())
    out = write(s, ok_resp + server.headers(1, [("grpc-status", "0")], end_stream=True), ts=11)
    assert out == [ResponseStatus(1, 200), RequestFinished(1, 11, 200, None)]
    assert ok.head.rpc["status_code"] == 0
    trailers_only = server.headers(3, [(":status", "200"), ("content-type", "application/grpc"),
                                       ("grpc-status", "5"), ("grpc-message", "not found")], end_stream=True)
    assert write(s, trailers_only, ts=12)[-1] == RequestFinished(3, 12, 200, None)
    assert bad.head.rpc["status_code"] == 5 and bad.head.rpc["method"] == "Fail"


def test_grpc_server_streaming_finishes_at_the_trailers():
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings() + client.headers(1, grpc_request(method="Stream")) + data(1, grpc_message(), True))
    out = write(s, server.headers(1, [(":status", "200"), ("content-type", "application/grpc")]))
    for _ in range(5):
        out += write(s, data(1, grpc_message(b"\x10\x02")))
    assert of(out, RequestFinished) == []
    out = write(s, server.headers(1, [("grpc-status", "0")], end_stream=True), ts=40)
    assert out == [RequestFinished(1, 40, 200, None)]


def test_grpc_response_without_grpc_status_is_an_error():
    s, client, server = h2(), Peer(), Peer()
    read(s, PREFACE + settings() + client.headers(1, grpc_request()) + data(1, grpc_message(), True))
    out = write(s, server.headers(1, [(":status", "200")]) + data(1, grpc_message(), end_stream=True))
    assert out[-1].error == "gRPC response without grpc-status"


def test_grpc_path_that_is_not_service_method():
    s, client = h2(), Peer()
    fields = [(":method", "POST"), (":path", "/only"), ("content-type", "application/grpc+proto")]
    [e] = read(s, PREFACE + settings() + client.headers(1, fields))
    assert e.head.rpc["service"] is None and e.head.protocol == "grpc"


def test_server_header_table_size_setting_is_followed():
    """A client that limits the server's table to 0 bytes: the server's size update to 0
    is accepted; a later update past the limit is an HPACK error."""
    s, client = h2(), Peer()
    limit0 = frame(0x4, 0, 0, (1).to_bytes(2, "big") + (0).to_bytes(4, "big"))
    read(s, PREFACE + limit0 + client.headers(1, get()))
    [e] = write(s, frame(HEADERS, 0x4, 1, b"\x3f\xe1\x1f\x88"))  # size update to 4096, then :status 200
    assert isinstance(e, ProtocolError) and e.counter == "h2_hpack_lost"


def test_streams_past_the_open_limit_are_counted_not_followed(monkeypatch):
    from otel_gpu.pipeline.protocols.http2 import session as session_module
    monkeypatch.setattr(session_module, "MAX_OPEN_STREAMS", 2)
    s, client = h2(), Peer()
    out = read(s, PREFACE + settings() + b"".join(client.headers(i, get(f"/{i}")) for i in (1, 3, 5)))
    assert [e.stream for e in of(out, RequestStarted)] == [1, 3]
    [notice] = [e for e in out if not isinstance(e, RequestStarted)]
    assert notice.counter == "h2_streams_untracked" and "stream 5" in notice.message
