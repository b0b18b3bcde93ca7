"""Python-context attribution (pipeline/contexts.py through the stitcher), over synthetic
records shaped like asyncio servers: one event-loop thread reads every request, each
request runs in its own task context, worker threads run copies of it. Every call
encodes its request in its kernel pointer, so the owner of every child is checked.
The cases one by one; whole interleaved flows: test_contexts_flow.py."""
import logging
import random

from otel_gpu.pipeline.contexts import ProcessContexts
from otel_gpu.pipeline.held import Holds
from otel_gpu.pipeline.process_state import Proc
from otel_gpu.pipeline.model import ProcessWindow, Request
from otel_gpu.records import (EV_SOCK_READ, EV_SOCK_WRITE, Accept, RequestOpened, ContextCopy, ProcessGone,
                              ProcExit, SockClose, SockIo, Tick)
from otel_gpu.pipeline.stitcher import Stitcher
from otel_gpu.ratelimit import RateLimitedLog, Stats
from tests.unit.pipeline import calls

PID, LOOP = 900, 1
BASE = 0xB0000      # the loop's own context: older than the collector, never seen created
BG_UNTRACKED = 0xB1000  # a background task created before the probes: never seen created
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
CHUNKED = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
BACKGROUND = 0xBBBB  # kernel pointer of background work


class Events:
    """Builds records with increasing timestamps."""

    def __init__(self):
        self.t = 1_000_000_000

    def ts(self):
        self.t += 1000
        return self.t

    def accept(self, fd, tid=LOOP):
        return Accept(PID, tid, self.ts(), fd, 3, "10.0.0.1", 50000 + fd)

    def read(self, fd, raw=None, tid=LOOP, ctx=BASE):
        raw = raw if raw is not None else f"GET /r/{fd} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        return SockIo(EV_SOCK_READ, PID, tid, self.ts(), fd, len(raw), raw, b"")

    def write(self, fd, ctx, raw=OK, tid=LOOP):
        return SockIo(EV_SOCK_WRITE, PID, tid, self.ts(), fd, len(raw), raw[:1024], raw[-8:], ctx)

    def copy(self, ctx, parent, tid=LOOP):
        return ContextCopy(PID, tid, self.ts(), ctx, parent)

    def call(self, ctx, func, tid=LOOP, name="cudaLaunchKernel", duration=0):
        return calls.cuda(name, tid, func, pid=PID, ts=self.ts(), ctx=ctx, duration=duration)

    def close(self, fd, tid=LOOP):
        return SockClose(PID, tid, self.ts(), fd)

    def tick(self, final=False, after_s=0):
        self.t += int(after_s * 1e9)
        return Tick(self.ts(), final)


def new(budget=256):
    return Stitcher(span_budget=budget, rng=random.Random(3))


def requests(out):
    return {r.fd: r for r in out if isinstance(r, Request)}


def windows(out):
    return {w.attribution: w for w in out if isinstance(w, ProcessWindow)}


def funcs(sink, attribution=None):
    return [c.func for c, a in sink.calls if attribution is None or a == attribution]


def task(fd):
    return 0x7000_0000 + fd


def worker_ctx(fd, k=0):
    return 0x8000_0000 + fd * 64 + k


# --- the cases one by one -----------------------------------------------------------
def test_fastapi_def_endpoint_calls_on_a_worker_thread_before_the_response():
    """The endpoint runs in a copy W of the request's task T on worker thread 2: its
    calls are held until T writes the response, then they are the request's."""
    e, s = Events(), new()
    t1, w1, t2 = task(10), worker_ctx(10), task(11)
    out = s.process([e.accept(10), e.accept(11), e.read(10), e.copy(t1, BASE), e.read(11), e.copy(t2, BASE),
                     e.copy(w1, t1)])
    first = e.call(w1, 10, tid=2)
    out = s.process([first, e.call(w1, 10, tid=2, name="cudaDeviceSynchronize", duration=500)])
    assert requests(out) == {} and s.state()["pending_calls"] == 2
    assert s.attributed["task"] == 0  # held calls are not counted yet
    out = s.process([e.write(10, t1)])
    (r,) = requests(out).values()
    assert [type(x).__name__ for x in out] == ["Request"]  # RequestOpened came at the read
    assert [a for _, a in r.sink.calls] == ["task", "task"]
    assert r.busy.start_ns == first.ts_ns < r.end_ns  # from the held call, before the bind
    assert r.busy.end_ns == r.sink.calls[1][0].ts_ns + 500
    assert s.attributed["task"] == 2 and s.state()["pending_calls"] == 0
    (r2,) = requests(s.process([e.write(11, t2)])).values()
    assert r2.sink.calls == [] and r2.sink.summary.ambiguous == 0


def test_background_task_in_an_untracked_context_is_never_the_one_open_request():
    e, s = Events(), new()
    t = task(10)
    s.process([e.accept(10), e.read(10), e.copy(t, BASE)])
    # Not bound yet: the background call is held (it can never be the request's own,
    # but the request might never bind its own context either), never `thread`.
    s.process([e.call(BG_UNTRACKED, BACKGROUND)])
    assert s.state()["pending_calls"] == 1
    # Bound at the first chunk: the request's work is in its own context, so both
    # background calls are nobody's.
    s.process([e.write(10, t, CHUNKED), e.call(BG_UNTRACKED, BACKGROUND), e.call(t, 10)])
    out = s.process([e.write(10, t, b"0\r\n\r\n"), e.tick()])
    (r,) = requests(out).values()
    assert funcs(r.sink) == [10] and r.sink.summary.ambiguous == 0
    ws = windows(out)
    assert list(ws) == ["outside"] and funcs(ws["outside"].sink) == [BACKGROUND, BACKGROUND]
    assert s.attributed["thread"] == s.attributed["process"] == 0 and s.state()["pending_calls"] == 0


def test_untracked_context_call_while_a_request_never_binds_is_ambiguous():
    """A request whose response is written from an old context (a callback-style server)
    never binds: a call in an untracked context while it was open may be its own."""
    e, s = Events(), new()
    t = task(10)
    s.process([e.accept(10), e.read(10), e.copy(t, BASE), e.call(BG_UNTRACKED, BACKGROUND)])
    out = s.process([e.write(10, BASE), e.tick()])  # written from the loop's own context
    (r,) = requests(out).values()
    ws = windows(out)
    assert list(ws) == ["ambiguous"] and ws["ambiguous"].candidates == [(r.trace_id, r.span_id)]
    assert r.sink.summary.ambiguous == 1


def test_untracked_context_on_a_thread_with_no_tracked_context_keeps_the_thread_rules():
    """A threaded server whose interpreter gives contexts but never copies one."""
    e, s = Events(), new()
    out = s.process([e.accept(10, tid=5), e.read(10, tid=5), e.call(0xC5, 10, tid=5),
                     e.call(0xC6, 10, tid=6), e.write(10, 0xC5, tid=5)])
    (r,) = requests(out).values()
    assert sorted((c.tid, a) for c, a in r.sink.calls) == [(5, "thread"), (6, "process")]  # thread calls land at its end


def test_background_task_tracked_before_any_request_is_outside_once_candidates_bind():
    e, s = Events(), new()
    bg = 0xBB
    s.process([e.copy(bg, BASE), e.call(bg, BACKGROUND)])  # nothing open: outside at once
    s.process([e.accept(10), e.accept(11), e.read(10), e.copy(task(10), BASE), e.read(11),
               e.copy(task(11), BASE), e.call(bg, BACKGROUND), e.call(task(10), 10), e.call(bg, BACKGROUND)])
    assert s.state()["pending_calls"] == 3
    out = s.process([e.write(10, task(10))])
    assert s.state()["pending_calls"] == 2  # request 11 may still own the background calls
    out += s.process([e.write(11, task(11)), e.tick()])
    reqs, ws = requests(out), windows(out)
    assert funcs(reqs[10].sink) == [10] and reqs[11].sink.calls == []
    assert all(r.sink.summary.ambiguous == 0 for r in reqs.values())
    assert list(ws) == ["outside"] and funcs(ws["outside"].sink) == [BACKGROUND] * 3
    assert ws["outside"].candidates == []
    assert s.attributed["outside"] == 3 and s.state()["pending_calls"] == 0


def test_request_that_closes_without_writing_leaves_its_held_calls_ambiguous_with_a_link():
    e, s = Events(), new()
    t1, t2 = task(10), task(11)
    s.process([e.accept(10), e.accept(11), e.read(10), e.copy(t1, BASE), e.read(11), e.copy(t2, BASE),
               e.call(t1, 10), e.call(t1, 10)])
    out = s.process([e.close(10)])  # client went away: request 10 never wrote
    (r1,) = requests(out).values()
    assert r1.error and r1.sink.calls == [] and r1.sink.summary.ambiguous == 1  # 2 calls, 2 candidates
    assert s.state()["pending_calls"] == 2  # request 11 (open, unbound) may still own them
    out = s.process([e.write(11, t2), e.tick()])
    (r2,) = requests(out).values()
    assert r2.sink.calls == [] and r2.sink.summary.ambiguous == 0
    w = windows(out)["ambiguous"]
    assert funcs(w.sink) == [10, 10] and w.candidates == [(r1.trace_id, r1.span_id)]
    assert s.attributed["ambiguous"] == 2 and s.state()["pending_calls"] == 0


def test_streaming_binds_at_the_first_chunk_and_calls_between_chunks_are_the_requests():
    """Starlette streams from a child task T2 of the request's task T: the first chunk
    binds T2 and T (newer than the request), not the connection's callback context."""
    e, s = Events(), new()
    conn, t, t2 = 0xC0, task(10), task(10) + 1
    s.process([e.accept(10), e.copy(conn, BASE)])  # the connection's reader callback: older
    s.process([e.read(10), e.copy(t, conn), e.call(t, 1), e.copy(t2, t), e.call(t2, 2)])
    s.process([e.write(10, t2, CHUNKED)])
    assert s.state()["pending_calls"] == 0 and s.state()["contexts_bound"] == 2
    s.process([e.call(t2, 3), e.write(10, t2, b"5\r\nhello\r\n"), e.call(t2, 4), e.call(t, 5),
               e.write(10, t2, b"5\r\nhello\r\n")])
    out = s.process([e.write(10, t2, b"0\r\n\r\n")])
    (r,) = requests(out).values()
    assert funcs(r.sink) == [1, 2, 3, 4, 5] and set(r.sink.attributed) == {"task"}
    assert r.context == t2
    assert s.state()["contexts_bound"] == 0
    # After the request: its contexts belong to nobody (a task it left running).
    s.process([e.call(t2, 6)])
    assert windows(s.process([e.tick()]))["outside"].sink.summary.calls == 1


def test_a_write_from_an_older_context_never_binds():
    e, s = Events(), new()
    conn, t = 0xC0, task(10)
    s.process([e.accept(10), e.copy(conn, BASE), e.read(10), e.copy(t, conn), e.call(t, 10)])
    # Written from the loop's base context (untracked) and the connection's (older): no binding.
    out = s.process([e.write(10, BASE, b"HTTP/1.1 200 OK\r\nContent-Length: 4\r\n\r\nok"),
                     e.write(10, conn, b"ok")])
    (r,) = requests(out).values()
    assert r.context == 0 and r.sink.calls == [] and r.sink.summary.ambiguous == 1
    assert funcs(windows(s.process([e.tick()]))["ambiguous"].sink) == [10]


def test_a_context_bound_to_an_open_request_is_not_bound_again():
    e, s = Events(), new()
    t1 = task(10)
    s.process([e.accept(10), e.accept(11), e.read(10), e.read(11), e.copy(t1, BASE),
               e.write(10, t1, CHUNKED)])
    out = s.process([e.write(11, t1), e.call(t1, 10), e.write(10, t1, b"0\r\n\r\n")])
    reqs = requests(out)
    assert reqs[11].context == 0 and reqs[10].context == t1
    assert funcs(reqs[10].sink) == [10] and reqs[11].sink.calls == []


def test_final_tick_settles_held_calls_with_open_candidates_as_unbound():
    e, s = Events(), new()
    s.process([e.accept(10), e.read(10), e.copy(task(10), BASE), e.call(task(10), 10)])
    out = s.process([e.tick(final=True)])
    (r,) = requests(out).values()
    assert r.error == "collector stopped" and r.sink.summary.ambiguous == 1
    w = windows(out)["ambiguous"]
    assert funcs(w.sink) == [10] and w.candidates == [(r.trace_id, r.span_id)]
    assert s.state()["pending_calls"] == 0


def test_process_exit_settles_held_calls_before_process_gone():
    e, s = Events(), new()
    s.process([e.accept(10), e.read(10), e.copy(task(10), BASE), e.call(task(10), 10)])
    out = s.process([ProcExit(PID, e.ts())])
    assert [type(x).__name__ for x in out] == ["Request", "ProcessWindow", "ProcessGone"]
    assert out[1].attribution == "ambiguous" and isinstance(out[-1], ProcessGone)


def test_state_reports_held_calls_and_contexts_and_returns_to_zero():
    e, s = Events(), new()
    assert {k: s.state()[k] for k in ("pending_calls", "contexts_tracked", "contexts_bound")} == \
        {"pending_calls": 0, "contexts_tracked": 0, "contexts_bound": 0}
    s.process([e.accept(10), e.read(10), e.copy(task(10), BASE), e.copy(worker_ctx(10), task(10)),
               e.call(worker_ctx(10), 10, tid=2)])
    st0 = s.state()
    assert (st0["pending_calls"], st0["contexts_tracked"], st0["contexts_bound"]) == (1, 2, 0)
    s.process([e.write(10, task(10))])
    assert s.state()["pending_calls"] == 0 and s.state()["contexts_bound"] == 0
    s.process([e.tick()])
    assert s.state()["contexts_tracked"] == 2  # recently used: kept a while
    s.process([e.tick(after_s=300)])
    assert s.state()["contexts_tracked"] == 0


def test_contexts_a_long_request_may_still_bind_are_kept():
    e, s = Events(), new()
    s.process([e.accept(10), e.read(10), e.copy(task(10), BASE), e.copy(0xDEAD, BASE)])
    s.process([e.tick(after_s=600)])
    assert s.state()["contexts_tracked"] == 2  # created after the open request started
    out = s.process([e.call(task(10), 10), e.write(10, task(10))])
    assert funcs(requests(out)[10].sink) == [10]


def test_held_calls_past_the_span_budget_are_folded_and_counts_add_up():
    e, s = Events(), new(budget=3)
    t = task(10)
    s.process([e.accept(10), e.read(10), e.copy(t, BASE)])
    s.process([e.call(t, 0x10 + i % 2) for i in range(10)] + [e.call(t, 0x30, name="cudaDeviceSynchronize",
                                                                      duration=700)])
    assert s.procs[PID].holds.entries == 3 + 3  # three one by one, three folds
    sync_ts = e.t  # the sync's entry: the last timestamp drawn
    out = s.process([e.write(10, t)])
    (r,) = requests(out).values()
    assert len(r.sink.calls) == 3 and r.sink.rolled_up == 8 and r.sink.summary.calls == 11
    assert r.sink.summary.launches == 10 and r.sink.summary.sync_ns == 700
    assert r.sink.attributed == {"task": 11}
    assert r.busy.end_ns == sync_ts + 700


def test_past_the_hard_cap_calls_are_ambiguous_at_once_and_counted():
    e, s = Events(), new()
    s.process([e.accept(10), e.read(10), e.copy(task(10), BASE)])
    s.procs[PID].holds.max_held = 2
    out = s.process([e.call(task(10), 10) for _ in range(4)] + [e.write(10, task(10)), e.tick()])
    (r,) = requests(out).values()
    assert funcs(r.sink) == [10, 10] and r.sink.summary.ambiguous == 2
    assert funcs(windows(out)["ambiguous"].sink) == [10, 10]
    assert s.stats.snapshot()["held_calls_overflow"] == 2 and s.by_rule["process.held_full"] == 2


# --- the forest on its own --------------------------------------------------------------
def table(**kw):
    stats = Stats()
    holds = Holds(Proc(PID), 256, stats, RateLimitedLog(logging.getLogger("test"), stats))
    return ProcessContexts(holds, stats, **kw)


def test_lru_keeps_bound_holding_and_working_contexts():
    e, c = Events(), table(max_contexts=3)
    c.copied(e.copy(1, BASE))
    c.copied(e.copy(2, BASE))
    c.call(e.call(2, 0))  # worked: a second chance (no request open)
    c.copied(e.copy(3, BASE))
    c.copied(e.copy(4, BASE))  # over the cap: 1 goes (least recent, idle)
    assert list(c.nodes) == [2, 3, 4] and c.stats.snapshot()["contexts_evicted"] == 1
    c.copied(e.copy(5, BASE))  # 2 worked: passed over once, 3 goes
    assert sorted(c.nodes) == [2, 4, 5]


def test_a_reused_address_is_a_new_context():
    e, s = Events(), new()
    t = task(10)
    s.process([e.accept(10), e.read(10), e.copy(t, BASE), e.copy(0x55, t)])
    # t is freed and its address reused by a context of something else, before the bind
    s.process([e.copy(t, BASE), e.call(0x55, 10)])
    out = s.process([e.write(10, t), e.tick()])
    (r,) = requests(out).values()
    # the new t is newer than the request and binds, but 0x55 descends from the old t
    assert r.context == t and r.sink.calls == []
    assert funcs(windows(out)["outside"].sink) == [10]


def test_request_opened_comes_before_the_request_when_held_calls_land():
    e, s = Events(), new()
    out = s.process([e.accept(10), e.read(10), e.copy(task(10), BASE), e.call(task(10), 10),
                     e.write(10, task(10))])
    kinds = [type(x) for x in out]
    assert kinds.index(RequestOpened) < kinds.index(Request)
