"""A request's time split (pipeline/time_split.py): its serving thread's sums at its answer
minus those at its first read; shared where that thread served another request meanwhile
or the request's calls ran on another thread; none where another thread answered."""
from otel_gpu.pipeline.model import CallSink, Request
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.time_split import MAX_THREADS, ThreadTimes
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, SockIo
from tests.unit.pipeline.calls import cuda

PID = 7


def io(kind, tid, ts, times):
    return SockIo(kind, PID, tid, ts, 3, 10, b"", b"", times=times)


def request(tid, start):
    return Request(PID, tid, 3, RequestHead("GET", "/x", "1.1", {}), start, trace_id=1, span_id=1,
                   sink=CallSink(8))


def test_the_split_is_the_serving_threads_between_its_read_and_its_answer():
    t = ThreadTimes()
    t.seen(io(EV_SOCK_READ, 11, 1_000, (100, 10, 0, 50)))
    r = request(11, 1_000)
    t.opened(r)
    t.seen(io(EV_SOCK_WRITE, 11, 41_000, (30_100, 2_010, 5_000, 3_050)))
    t.finished(r, 41_000)
    assert r.time_split == (30_000, 2_000, 5_000, 3_000) and not r.time_shared
    assert sum(r.time_split) <= 41_000 - 1_000


def test_a_request_answered_by_another_thread_is_not_split():
    t = ThreadTimes()
    t.seen(io(EV_SOCK_READ, 11, 1_000, (0, 0, 0, 0)))
    r = request(11, 1_000)
    t.opened(r)
    t.seen(io(EV_SOCK_WRITE, 12, 9_000, (5, 5, 5, 5)))
    t.finished(r, 9_000)
    assert r.time_split is None


def test_a_thread_unknown_to_the_sched_probes_is_not_split():
    t = ThreadTimes()
    t.seen(io(EV_SOCK_READ, 11, 1_000, None))
    r = request(11, 1_000)
    t.opened(r)
    t.seen(io(EV_SOCK_WRITE, 11, 9_000, (5, 5, 5, 5)))
    t.finished(r, 9_000)
    assert r.time_split is None


def test_requests_overlapping_on_one_thread_are_shared():
    t = ThreadTimes()
    t.seen(io(EV_SOCK_READ, 11, 1_000, (0, 0, 0, 0)))
    a = request(11, 1_000)
    t.opened(a)
    t.seen(io(EV_SOCK_READ, 11, 2_000, (900, 0, 0, 100)))
    b = request(11, 2_000)
    t.opened(b)
    for r, ts in ((a, 5_000), (b, 6_000)):
        t.seen(io(EV_SOCK_WRITE, 11, ts, (ts - 1_000, 0, 0, 0)))
        t.finished(r, ts)
    assert a.time_shared and b.time_shared
    # the next, alone on the thread again, is its own
    t.seen(io(EV_SOCK_READ, 11, 7_000, (6_000, 0, 0, 0)))
    c = request(11, 7_000)
    t.opened(c)
    t.seen(io(EV_SOCK_WRITE, 11, 8_000, (7_000, 0, 0, 0)))
    t.finished(c, 8_000)
    assert c.time_split == (1_000, 0, 0, 0) and not c.time_shared


def test_calls_on_another_thread_make_it_shared():
    t = ThreadTimes()
    t.seen(io(EV_SOCK_READ, 11, 1_000, (0, 0, 0, 0)))
    r = request(11, 1_000)
    t.opened(r)
    r.sink.add(cuda(pid=PID, tid=12), "task")  # a worker thread ran its launch
    t.seen(io(EV_SOCK_WRITE, 11, 3_000, (100, 0, 0, 1_900)))
    t.finished(r, 3_000)
    assert r.time_split == (100, 0, 0, 1_900) and r.time_shared


def test_threads_are_bounded():
    t = ThreadTimes()
    for tid in range(MAX_THREADS + 5):
        t.seen(io(EV_SOCK_READ, tid, tid, (0, 0, 0, 0)))
    r = request(0, 0)  # the least recently seen thread is gone
    t.opened(r)
    assert r.times_start is None
    r = request(MAX_THREADS + 4, MAX_THREADS + 4)
    t.opened(r)
    assert r.times_start == (0, 0, 0, 0)
