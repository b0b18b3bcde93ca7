"""pipeline/steps.py through the stitcher: a batch step's window is linked to the
requests that wrote a response chunk after it (members), to requests that have written
nothing yet (overlap), and never to a streaming request that wrote nothing for that step
(queued in the engine, or done there and still closing). Records shaped like an SSE
front-end relaying an engine's tokens, the engine in a related process."""
import random

from otel_gpu.pipeline.model import ProcessWindow, Request
from otel_gpu.records import Tick
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline.facts import WithFacts
from tests.unit.pipeline.test_shared import FRONT, GROUPS, WORKER, ids, open_requests, step
from tests.unit.pipeline.test_stitcher import T, accept, get, read, write

SSE_HEAD = b"HTTP/1.1 200 OK\r\nContent-Type: text/event-stream\r\nTransfer-Encoding: chunked\r\n\r\n"


def token(n):
    data = f"data: {n}\n\n".encode()
    return f"{len(data):x}\r\n".encode() + data + b"\r\n"


def sse(fd, raw):
    return write(raw, fd=fd, tid=fd, pid=FRONT)


def steps_out(out):
    return [w for w in out if isinstance(w, ProcessWindow) and w.attribution == "shared"]


def test_queued_and_finished_streams_are_not_linked_to_steps_they_were_not_in():
    s = WithFacts(Stitcher(span_budget=256, rng=random.Random(3)), group_of=GROUPS.get)
    reqs = open_requests(s, [10, 11, 12])
    s.process([sse(fd, SSE_HEAD) for fd in (10, 11, 12)])  # every stream's headers at once
    # Step 1: 10 and 11 (12 queued); 10's last token, then its end at once. Step 2: 11 and
    # 12, while 10's client still reads (its connection open).
    s.process(step(2, grid=1) + [sse(10, token(1)), sse(10, b"0\r\n\r\n"), sse(11, token(1))])
    s.process(step(2, grid=2) + [sse(11, token(2)), sse(12, token(2))])
    out = s.process([sse(fd, b"0\r\n\r\n") for fd in (11, 12)] + [Tick(T() + 10**9)])
    w1, w2 = steps_out(out)
    assert w1.candidates == [ids(reqs[10]), ids(reqs[11])] and set(w1.link_rules.values()) == {"batch_member"}
    assert w2.candidates == [ids(reqs[11]), ids(reqs[12])]
    assert s.steps.state() == {"batch_steps_pending": 0}
    done = {r.fd: r for r in out if isinstance(r, Request)}
    assert done[11].chunks == 3 and done[11].headers_ts  # two tokens and the terminator
    # queued: until the first step each was in; 12 waited through step 1
    assert [reqs[fd].queued_ns for fd in (10, 11, 12)] == [w1.start_ns - reqs[10].start_ns,
                                                           w1.start_ns - reqs[11].start_ns,
                                                           w2.start_ns - reqs[12].start_ns]
    assert reqs[12].queued_ns > reqs[11].queued_ns


def test_a_request_answered_in_one_write_is_linked_by_overlap_until_it_writes():
    s = WithFacts(Stitcher(span_budget=256, rng=random.Random(3)), group_of=GROUPS.get)
    reqs = open_requests(s, [10])
    s.process(step(1, grid=1))
    s.process(step(1, grid=2))
    s.process([sse(10, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok")])
    w1, w2 = steps_out(s.process([Tick(T() + 10**9)]))
    assert w1.link_rules == {ids(reqs[10]): "overlap"}  # nothing written before step 2 ended
    assert w2.link_rules == {ids(reqs[10]): "batch_member"}  # its answer came after step 2
    # Its one write follows its last step, not its first (it may have been in step 1 too):
    # no queueing time, even with both steps decided before its span goes (the records
    # read in one batch).
    assert reqs[10].queued_ns is None


def test_steps_wait_for_their_evidence_then_go_without_a_tick():
    s = WithFacts(Stitcher(span_budget=256, rng=random.Random(3)), group_of=GROUPS.get)
    open_requests(s, [10])
    s.process([sse(10, SSE_HEAD)])
    assert steps_out(s.process(step(1, grid=1))) == []
    T.t += 30_000_000  # the next step ends later than the lag
    assert steps_out(s.process(step(1, grid=2))) == []
    T.t += 30_000_000
    (w1,) = steps_out(s.process(step(1, grid=3)))  # step 1's interval has passed: decided
    assert w1.sink.calls[0][0].func == 0x1001 and w1.candidates == []  # 10 wrote nothing for it
    assert w1.tgid == WORKER


def test_an_answer_whose_head_and_body_are_two_writes_is_its_step_member():
    """A response of declared length whose head goes out in one step's interval and its
    body in the next (a threaded server between its two writes): the head is its answer."""
    s = WithFacts(Stitcher(span_budget=256, rng=random.Random(3)), group_of=GROUPS.get)
    reqs = open_requests(s, [10])
    s.process(step(1, grid=1) + [sse(10, b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\n")])
    s.process(step(1, grid=2) + [sse(10, b"ok")])
    w1, w2 = steps_out(s.process([Tick(T() + 10**9)]))
    assert w1.link_rules == {ids(reqs[10]): "batch_member"}
    assert w2.link_rules == {}  # answered before step 2 ended: not in it (its body's write: the same answer)


def test_a_request_read_before_a_step_ended_but_begun_after_it_is_not_linked():
    """Records of two CPUs out of order (on a starved host, by milliseconds): the head of
    request 11, read after the step's last call ended, comes out of the ring buffer before
    that call's record. 11 was open as the stitcher read the call, not while it ran."""
    s = WithFacts(Stitcher(span_budget=256, rng=random.Random(3)), group_of=GROUPS.get)
    reqs = open_requests(s, [10])
    calls = step(2, grid=1)  # timestamps before the head's
    head = [accept(fd=11, pid=FRONT), read(get("/gen/11"), fd=11, tid=11, pid=FRONT)]
    assert head[1].ts_ns > calls[-1].ts_ns
    out = s.process(calls[:-1] + head + calls[-1:])
    reqs[11] = next(o.request for o in out if hasattr(o, "request") and o.request.fd == 11)
    assert reqs[11].start_ns > calls[-1].ts_ns
    (w1,) = steps_out(s.process([Tick(T() + 10**9)]))
    assert w1.link_rules == {ids(reqs[10]): "overlap"} and w1.candidates == [ids(reqs[10])]
