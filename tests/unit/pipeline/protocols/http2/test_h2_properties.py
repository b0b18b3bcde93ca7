"""Property tests for the HTTP/2 session: whatever bytes arrive, it returns events
and never raises; garbage never opens a request; how a stream is cut into reads does
not change what it finds; and a conversation cut short by the probe's copy gives the
same requests as the whole one, or a counted drop, never a different request; and
read through the kernel's frame walk (its digests), every request, whatever the cuts."""
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from otel_gpu.kernel_io.abi import H2_STOP_STEPS
from otel_gpu.pipeline.protocols.base import ProtocolError, RequestStarted
from otel_gpu.pipeline.protocols.http2.session import H2Session
from otel_gpu.records import H2Digest
from tests.unit.pipeline.protocols.http2.h2_digest import walk
from tests.unit.pipeline.protocols.http2.h2_wire import (PREFACE, Peer, data, get, goaway, grpc_message,
                                                         grpc_request, rst, settings as settings_frame)

PROPS = settings(max_examples=1500, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
FRAGMENTS = [PREFACE, settings_frame(), b"\x00\x00\x00\x04\x01\x00\x00\x00\x00", b"\x00\x00\x05\x01\x05\x00\x00\x00\x01",
             b"\x82\x84\x86", b"\x00\x00\x08\x06\x00\x00\x00\x00\x00", b"\xff" * 9, b"\x00" * 9, b"GET / HTTP/1.1\r\n",
             b"\x16\x03\x01", rst(1), goaway(0), data(1, b"x", True)]
garbage = st.lists(st.one_of(st.binary(max_size=64), st.sampled_from(FRAGMENTS)), max_size=12).map(b"".join)


def _feed(session, chunks, cap=1024):
    events = []
    for c in chunks:
        events += session.on_read(c[:cap], len(c), 1, 1)
    return events


def _cuts(raw: bytes, points: list) -> list:
    points = sorted({p % (len(raw) + 1) for p in points})
    return [raw[a:b] for a, b in zip([0] + points, points + [len(raw)]) if b > a]


@PROPS
@given(garbage, st.lists(st.integers(0, 10_000), max_size=6))
def test_garbage_never_raises_and_never_opens_a_request_without_a_real_preface(raw, points):
    if raw.startswith(PREFACE[:4]):
        raw = b"X" + raw
    events = _feed(H2Session(), _cuts(raw, points))
    assert all(isinstance(e, ProtocolError) for e in events) and len(events) <= 1
    if len(raw) >= 4:
        assert len(events) == 1 and events[0].counter == "h2_parse_errors"


@PROPS
@given(garbage, st.lists(st.integers(0, 10_000), max_size=6))
def test_garbage_after_the_preface_is_the_same_whatever_the_reads(raw, points):
    whole = PREFACE + settings_frame() + raw
    at_once = _feed(H2Session(), [whole])
    cut = _feed(H2Session(), _cuts(whole, points))
    assert [type(e) for e in at_once] == [type(e) for e in cut]
    errors = [e for e in cut if isinstance(e, ProtocolError)]
    assert len(errors) <= 1 and (not errors or cut[-1] is errors[0])  # nothing after the drop


def _conversation(n_streams: int, pad: int, grpc: bool) -> bytes:
    client = Peer()
    out = PREFACE + settings_frame()
    for i in range(n_streams):
        stream = 2 * i + 1
        fields = grpc_request(method=f"M{i}") if grpc else get(f"/r/{i}", extra=(("x-pad", "p" * pad),))
        out += client.headers(stream, fields) + data(stream, grpc_message(b"q" * pad), end_stream=True)
    return out


@PROPS
@given(st.integers(1, 6), st.integers(0, 600), st.booleans(), st.lists(st.integers(0, 20_000), max_size=8),
       st.integers(1, 1024))
def test_reads_cut_by_the_copy_give_the_same_requests_or_a_counted_drop(n, pad, grpc, points, cap):
    raw = _conversation(n, pad, grpc)
    want = [(e.stream, e.head) for e in _feed(H2Session(), [raw], cap=len(raw))]
    assert len(want) == n
    got = _feed(H2Session(), _cuts(raw, points), cap=cap)
    started = [(e.stream, e.head) for e in got if isinstance(e, RequestStarted)]
    assert started == want[:len(started)]  # never a different request
    if len(started) < n:
        [err] = [e for e in got if isinstance(e, ProtocolError)]
        assert err.counter in ("h2_parse_errors", "h2_hpack_lost")


def _feed_walked(session, chunks, preface=True):
    """The chunks as the kernel's frame walk hands them over (h2_digest.walk)."""
    events = []
    for chunk, records in zip(chunks, walk(chunks, preface)):
        for digest in records:
            events += session.on_read(digest, len(chunk), 1, 1)
    return events


@settings(max_examples=400, deadline=None, database=None, suppress_health_check=[HealthCheck.too_slow])
@given(st.integers(1, 40), st.integers(0, 3000), st.booleans(), st.lists(st.integers(0, 200_000), max_size=12))
def test_walked_reads_give_every_request_whatever_the_cuts(n, pad, grpc, points):
    """However many streams one read carries and wherever reads cut frames (a frame
    header included), the kernel's digests give the requests the whole bytes give."""
    raw = _conversation(n, pad, grpc)
    want = [(e.stream, e.head) for e in _feed(H2Session(), [raw], cap=len(raw))]
    got = _feed_walked(H2Session(), _cuts(raw, points))
    started = [(e.stream, e.head) for e in got if isinstance(e, RequestStarted)]
    errors = [e.counter for e in got if isinstance(e, ProtocolError)]
    # Every request, or (a read of more header blocks than the digest's records hold:
    # 64 KiB) the ones before, and the stop counted by its cause.
    assert (started, errors) == (want, []) or (started == want[:len(started)] and errors == ["h2_walk_room"])
    if max(len(c) for c in _cuts(raw, points)) < 30_000:
        assert errors == []  # no read of more than 30 kB (a digest of at most 50 kB): nothing stops


def test_a_stopped_walk_drops_the_connection_with_its_cause():
    raw = _conversation(2, 0, False)
    [records] = walk([raw])
    stopped = [H2Digest(d.pieces, d.more, H2_STOP_STEPS) for d in records]
    got = H2Session().on_read(stopped[0], len(raw), 1, 1)
    [err] = [e for e in got if isinstance(e, ProtocolError)]
    assert err.counter == "h2_walk_steps"
