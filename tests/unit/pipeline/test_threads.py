"""pipeline/threads.py through the stitcher: a call the thread rule gives to a request
lands there only when that request's thread touched no other connection while it was
open; otherwise it is ambiguous, linked to the requests open at the call. Records
shaped like a thread-per-connection server (proven), a pool whose threads run other
connections' work in between (an M:N runtime seen only by its threads: not proven), and
a one-thread event loop."""
from tests.unit.pipeline.test_contexts import Events, new, requests, windows

def test_a_thread_per_connection_server_is_proven():
    e, s = Events(), new()
    out = s.process([e.accept(10, tid=5), e.accept(11, tid=6), e.read(10, tid=5), e.read(11, tid=6),
                     e.call(0, 10, tid=5), e.call(0, 11, tid=6), e.call(0, 10, tid=5),
                     e.write(10, 0, tid=5), e.write(11, 0, tid=6), e.tick()])
    reqs = requests(out)
    assert [c.func for c, a in reqs[10].sink.calls] == [10, 10]
    assert [c.func for c, a in reqs[11].sink.calls] == [11]
    assert {a for r in reqs.values() for _, a in r.sink.calls} == {"thread"}
    assert s.by_rule["thread.one"] == 3 and not s.by_rule["thread.unproven"]


def test_a_thread_that_served_another_connection_meanwhile_is_not_proven():
    """Thread 5 read request A (fd 10); thread 6 read B (fd 11); then thread 5 wrote B's
    response, so it ran B's work while A was open: its call may be B's, never A's."""
    e, s = Events(), new()
    out = s.process([e.accept(10, tid=5), e.accept(11, tid=6), e.read(10, tid=5), e.read(11, tid=6),
                     e.call(0, 11, tid=5), e.write(11, 0, tid=5), e.call(0, 10, tid=5), e.write(10, 0, tid=5),
                     e.tick()])
    reqs = requests(out)
    assert not reqs[10].sink.calls and not reqs[11].sink.calls
    (w,) = [w for w in windows(out).values() if w.attribution == "ambiguous"]
    assert sorted(c.func for c, _ in w.sink.calls) == [10, 11]
    assert {ids for ids in w.candidates} >= {(reqs[10].trace_id, reqs[10].span_id)}
    assert s.by_rule["thread.unproven"] == 2 and not s.by_rule["thread.one"]
    assert reqs[10].sink.summary.ambiguous > 0  # its share of what may have been its own


def test_an_event_loop_thread_reading_several_connections_is_not_proven():
    e, s = Events(), new()
    out = s.process([e.accept(10), e.accept(11), e.read(10), e.read(11), e.call(0, 1),
                     e.write(11, 0), e.call(0, 2), e.write(10, 0), e.tick()])
    reqs = requests(out)
    assert not reqs[10].sink.calls and not reqs[11].sink.calls
    assert s.by_rule["thread.several"] == 1 and s.by_rule["thread.unproven"] == 1


def test_a_request_alone_on_its_thread_before_and_after_others_is_proven():
    """Keep-alive on one connection: the thread reads the next request only after the
    previous one finished (same fd): nothing mixed."""
    e, s = Events(), new()
    out = s.process([e.accept(10, tid=5), e.read(10, tid=5), e.call(0, 1, tid=5), e.write(10, 0, tid=5),
                     e.read(10, tid=5), e.call(0, 2, tid=5), e.write(10, 0, tid=5), e.tick()])
    funcs = sorted(c.func for r in out if hasattr(r, "sink") and hasattr(r, "head") for c, _ in r.sink.calls)
    assert funcs == [1, 2] and s.by_rule["thread.one"] == 2
