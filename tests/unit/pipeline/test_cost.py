"""Cost model: busy windows, overlap splitting, prices, and the settle rule (a request's
cost follows it once no overlapping request is open)."""
from __future__ import annotations

import random

import pytest

from otel_gpu.pipeline.busy_time import remainder_seconds, split_by_overlap, split_seconds
from otel_gpu.pipeline.cost import UNKNOWN_FEATURE, CostStage, Prices, sink_busy
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.model import CallSink, ProcessWindow, Request
from otel_gpu.records import (EV_SOCK_READ, EV_SOCK_WRITE, Accept, RequestOpened, ProcessGone, RequestCost, SockIo,
                              Tick)
from otel_gpu.pipeline.stitcher import Stitcher
from otel_gpu.cuda_calls import call_id
from tests.unit.pipeline.calls import cuda

MS = 1_000_000


def call(ts, name="cudaLaunchKernel", duration=0):
    return cuda(name, ts=ts, duration=duration, ret=-1)


def request(start_ms, end_ms, device=0, path="/a", headers=None):
    r = Request(1, 1, 3, RequestHead("GET", path, "1.1", headers or {}), start_ms * MS, 1, 2, CallSink(8))
    r.busy.add(call(start_ms * MS), device)
    r.busy.add(call((end_ms - 1) * MS, "cudaDeviceSynchronize", duration=MS), device)  # sync ends at end_ms
    return r


def test_split_seconds():
    assert split_seconds((0, 1000 * MS), []) == pytest.approx(1.0)
    assert split_seconds((0, 1000 * MS), [(500 * MS, 1500 * MS)]) == pytest.approx(0.75)
    assert split_seconds((0, 1000 * MS), [(0, 1000 * MS), (0, 1000 * MS)]) == pytest.approx(1 / 3)
    assert split_seconds((0, 1000 * MS), [(2000 * MS, 3000 * MS)]) == pytest.approx(1.0)
    assert split_seconds((5, 5), []) == 0.0


def test_prices_by_model_and_default():
    p = Prices("H100=4.0,A100=2.0,default=1.0", model="NVIDIA H100 80GB HBM3")
    assert p.per_hour == 4.0
    assert Prices("H100=4.0,default=1.0", model="Tesla T4").per_hour == 1.0
    assert Prices("2.5", model="").per_hour == 2.5
    with pytest.raises(ValueError):
        Prices("H100=abc", model="")
    with pytest.raises(ValueError):
        Prices("-1", model="")


def test_overlapping_requests_split_and_sum_to_the_union():
    stage = CostStage(Prices("3.6", model=""), clock=lambda: 0.0)
    a, b = request(0, 100), request(50, 150)
    out = stage.process([a, b])  # finished in the same batch
    assert {id(r) for r in out} == {id(a), id(b)}
    assert a.gpu_seconds == pytest.approx(0.075) and b.gpu_seconds == pytest.approx(0.075)
    assert a.gpu_seconds + b.gpu_seconds == pytest.approx(0.150)
    assert a.cost == pytest.approx(0.075 * 3.6 / 3600)


def test_a_request_goes_on_at_once_and_its_cost_follows_once_settled():
    a, b = request(0, 100), request(50, 150)
    stage = CostStage(Prices("1", model=""), clock=lambda: 0.0)
    # The stitcher said both had begun GPU work; b started before a's window ended.
    assert stage.process([RequestOpened(a), RequestOpened(b), a]) == [a]
    assert a.cost_pending and a.gpu_seconds is None
    out = stage.process([b])
    assert out in ([RequestCost(a), b], [b, RequestCost(a)])
    assert a.gpu_seconds == pytest.approx(0.075) and b.gpu_seconds == pytest.approx(0.075)
    assert not b.cost_pending


def test_different_devices_do_not_share():
    stage = CostStage(Prices("1", model=""), clock=lambda: 0.0)
    a, b = request(0, 100, device=0), request(0, 100, device=1)
    stage.process([a, b])
    assert a.gpu_seconds == pytest.approx(0.1) and b.gpu_seconds == pytest.approx(0.1)


def test_hold_is_bounded_and_flush_releases():
    now = [0.0]
    b = request(50, 150)
    stage = CostStage(Prices("1", model=""), max_hold_s=30, clock=lambda: now[0])
    a = request(0, 100)
    assert stage.process([RequestOpened(b), a]) == [a]
    now[0] = 31.0
    tick = Tick(1)
    assert stage.process([tick]) == [tick, RequestCost(a)]  # settled at the next Tick past the hold
    c = request(0, 100)
    assert stage.process([c]) == [c]  # b is still open
    final = Tick(2, final=True)
    assert stage.process([final]) == [RequestCost(c), final]


def test_feature_from_header_else_route():
    stage = CostStage(Prices("1", model=""), feature_header="x-feature", clock=lambda: 0.0)
    r1 = request(0, 10, path="/items/7", headers={"x-feature": "search"})
    r2 = request(0, 10, path="/items/8")
    r1.route = r2.route = "/items/{id}"  # written by enrich
    stage.process([r1, r2])
    assert r1.feature == "search" and r2.feature == "/items/{id}"


def test_request_without_cuda_costs_nothing():
    stage = CostStage(Prices("1", model=""), clock=lambda: 0.0)
    r = Request(1, 1, 3, RequestHead("GET", "/h", "1.1", {}), 0, 1, 2, CallSink(8))
    assert stage.process([r]) == [r] and r.gpu_seconds == 0.0 and r.cost == 0.0


# --- windows: ambiguous/outside calls of one process, one per flush ------------------
def window(attribution, busy_ms, candidates=(), pid=1, budget=8):
    """A window whose calls keep the device busy over `busy_ms` (a launch, then a sync)."""
    sink = CallSink(budget)
    start, end = busy_ms
    sink.add(call(start * MS), attribution)
    sink.add(call((end - 1) * MS, "cudaDeviceSynchronize", duration=MS), attribution)
    return ProcessWindow(pid, attribution, start * MS, end * MS, sink, candidates=list(candidates))


def finished(start_ms, end_ms, ids, busy=None, path="/a"):
    """A request open over [start_ms, end_ms] with (trace_id, span_id) `ids`; busy over
    `busy` (ms) when it made calls of its own."""
    r = Request(1, 1, 3, RequestHead("GET", path, "1.1", {}), start_ms * MS, *ids, CallSink(8),
                end_ns=end_ms * MS)
    if busy:
        r.busy.add(call(busy[0] * MS), 0)
        r.busy.add(call((busy[1] - 1) * MS, "cudaDeviceSynchronize", duration=MS), 0)
    return r


def stage(**kw):
    return CostStage(Prices("3.6", model=""), clock=lambda: 0.0, **kw)


def test_remainder_seconds():
    w = (0, 100 * MS)
    assert remainder_seconds(w, [], []) == pytest.approx(0.1)
    assert remainder_seconds(w, [(0, 40 * MS)], []) == pytest.approx(0.06)
    assert remainder_seconds(w, [(0, 40 * MS)], [(20 * MS, 60 * MS)]) == pytest.approx(0.04 + 0.01)
    assert remainder_seconds(w, [(-5, 200 * MS)], [(0, 100 * MS)]) == 0.0


def test_sink_busy_follows_the_busy_window_rule():
    sink = CallSink(2)
    assert sink_busy(sink) is None
    sink.add(call(10 * MS), "outside")
    sink.add(call(20 * MS, "cudaStreamSynchronize", duration=5 * MS), "outside")  # ends at 25
    assert sink_busy(sink) == (10 * MS, 25 * MS)
    sink.add(call(30 * MS), "outside")  # past the budget: a rollup, first_ts..last_ts
    assert sink_busy(sink) == (10 * MS, 30 * MS)
    sink.add_aggregate(call_id("cudaLaunchKernel"), 0, 4, 0, 0, 40 * MS, "outside")  # counted in the kernel
    assert sink_busy(sink) == (10 * MS, 40 * MS)


def test_split_by_overlap():
    busy = (0, 100)
    assert split_by_overlap(1.0, busy, {"a": (0, 100), "b": (50, 150)}) == pytest.approx({"a": 2 / 3, "b": 1 / 3})
    assert split_by_overlap(1.0, busy, {"a": (200, 300), "b": (300, 400)}) == {"a": 0.5, "b": 0.5}
    assert split_by_overlap(1.0, busy, {"a": None, "b": (0, 100)}) == {"a": 0.5, "b": 0.5}
    assert split_by_overlap(1.0, busy, {}) == {}


def test_outside_window_is_charged_what_no_request_was():
    s = stage()
    r = finished(0, 100, (1, 1), busy=(0, 100))
    w = window("outside", (50, 150))
    out = s.process([r, w, Tick(1)])
    assert w in out and r in out
    assert r.gpu_seconds == pytest.approx(0.1)  # requests are priced as before
    assert w.gpu_seconds == pytest.approx(0.05) and w.cost == pytest.approx(0.05 * 3.6 / 3600)
    assert w.split == {}


def test_ambiguous_window_is_split_by_overlap_among_its_candidates():
    s = stage()
    a, b = finished(0, 100, (1, 1), path="/a"), finished(50, 150, (2, 2), path="/b")
    w = window("ambiguous", (60, 140), candidates=[(1, 1), (2, 2)])
    s.process([a, b, w, Tick(1)])
    assert w.gpu_seconds == pytest.approx(0.08)
    # a was open 40 ms of the window's busy time, b 80 ms.
    assert w.split == pytest.approx({(1, 1): 0.08 / 3, (2, 2): 0.16 / 3})
    assert w.split_features == {(1, 1): "/a", (2, 2): "/b"}


def test_window_waits_for_its_candidates_to_finish():
    s = stage()
    a = finished(0, 100, (1, 1))
    w = window("ambiguous", (10, 30), candidates=[(1, 1), (2, 2)])
    assert s.process([a, w, Tick(1)]) == [Tick(1), a]  # (2, 2) still open
    b = finished(5, 200, (2, 2), busy=(20, 50))
    out = s.process([b])
    assert w in out and b in out
    assert w.gpu_seconds == pytest.approx(0.01)  # 20..30 was b's own
    assert sum(w.split.values()) == pytest.approx(w.gpu_seconds)


def test_window_waits_while_an_open_request_may_overlap_it():
    s = stage()
    r = finished(0, 100, (1, 1), busy=(40, 100))
    w = window("outside", (0, 50))
    assert s.process([RequestOpened(r), w, Tick(1)]) == [Tick(1)]
    out = s.process([r])
    assert out == [w, r] and w.gpu_seconds == pytest.approx(0.04)


def test_windows_of_one_process_share_overlapping_time_evenly():
    s = stage()
    a = finished(0, 200, (1, 1))
    amb = window("ambiguous", (0, 100), candidates=[(1, 1)])
    out_w = window("outside", (50, 150))
    s.process([a, amb, out_w, Tick(1)])
    assert amb.gpu_seconds == pytest.approx(0.075) and out_w.gpu_seconds == pytest.approx(0.075)
    assert amb.split == pytest.approx({(1, 1): 0.075})
    later = window("outside", (100, 160))  # next flush: 100..150 is charged already
    s.process([later, Tick(2)])
    assert later.gpu_seconds == pytest.approx(0.01)


def test_window_hold_is_bounded_and_released_on_exit_and_at_the_end():
    now = [0.0]
    s = CostStage(Prices("1", model=""), max_hold_s=30, clock=lambda: now[0])
    w = window("ambiguous", (0, 10), candidates=[(9, 9)])  # never seen finishing
    assert s.process([w, Tick(1)]) == [Tick(1)]
    now[0] = 31.0
    assert s.process([Tick(2)]) == [Tick(2), w]
    assert w.split == {(9, 9): pytest.approx(0.01)} and w.split_features == {(9, 9): UNKNOWN_FEATURE}
    gone = window("ambiguous", (0, 10), candidates=[(8, 8)])
    assert s.process([gone, ProcessGone(1, "x")]) == [gone, ProcessGone(1, "x")]
    last = window("ambiguous", (0, 10), candidates=[(7, 7)])
    final = Tick(3, final=True)
    assert s.process([last, final]) == [last, final]


def test_window_memory_is_bounded_by_ticks():
    s = stage()
    for i in range(50):
        s.process([finished(i, i + 1, (i, i), busy=(i, i + 1)), Tick(i)])
    assert len(s._finished) <= 2 and sum(map(len, s._charged.values())) <= 2


# --- the stitcher's side of what cost relies on --------------------------------------
def _io(kind, ts, fd, tid, raw):
    return SockIo(kind, 1, tid, ts, fd, len(raw), raw, raw[-8:])


def _two_open_requests(budget):
    s = Stitcher(span_budget=budget, rng=random.Random(1))
    s.process([Accept(1, 1, 1, 10, 3, "10.0.0.9", 1), Accept(1, 2, 2, 11, 3, "10.0.0.9", 2),
               _io(EV_SOCK_READ, 3, 10, 1, b"GET /a HTTP/1.1\r\n\r\n"),
               _io(EV_SOCK_READ, 4, 11, 2, b"GET /b HTTP/1.1\r\n\r\n")])
    return s


def test_window_budget_is_per_flush_not_per_process_lifetime():
    """Each Tick hands on the window; the next call opens a new one with a whole budget."""
    s = _two_open_requests(budget=2)
    for flush in range(3):
        calls = [cuda(tid=3, ts=100 * flush + 10 + i, ret=-1) for i in range(3)]  # a third thread: ambiguous
        (w, tick) = s.process(calls + [Tick(100 * flush + 50)])
        assert w.attribution == "ambiguous" and len(w.sink.calls) == 2 and w.sink.rolled_up == 1


def test_ambiguous_call_shares_sum_to_the_ambiguous_calls():
    s = _two_open_requests(budget=8)
    s.process([cuda(tid=3, ts=10, ret=-1), cuda(tid=3, ts=11, ret=-1)])  # two calls, two candidates each
    ok = b"HTTP/1.1 200 OK\r\nContent-Length: 0\r\n\r\n"
    out = s.process([_io(EV_SOCK_WRITE, 20, 10, 1, ok), _io(EV_SOCK_WRITE, 21, 11, 2, ok)])
    assert sum(r.sink.summary.ambiguous for r in out if isinstance(r, Request)) == pytest.approx(2)


def test_shared_windows_split_among_requests_of_another_process_and_go_step_by_step():
    """A worker's batch steps (shared windows of pid 2) split among the front-end's
    requests (pid 1) like ambiguous ones; under steady load a step whose candidates
    have finished goes while the next one still waits for its own."""
    s = stage()
    a, b, c = (finished(0, 60, (1, 1), path="/a"), finished(10, 100, (2, 2), path="/b"),
               finished(70, 300, (3, 3), path="/c"))
    s1 = window("shared", (20, 50), candidates=[(1, 1), (2, 2)], pid=2)
    s2 = window("shared", (80, 120), candidates=[(2, 2), (3, 3)], pid=2)
    out = s.process([RequestOpened(a), RequestOpened(b), RequestOpened(c), s1, a, b, s2])
    assert s1 in out and s2 not in out  # c is still open
    assert s1.gpu_seconds == pytest.approx(0.03) and s1.split == pytest.approx({(1, 1): 0.015, (2, 2): 0.015})
    assert s1.split_features == {(1, 1): "/a", (2, 2): "/b"}
    out = s.process([c])
    assert s2 in out and s2.gpu_seconds == pytest.approx(0.04)
    # b was open 20 ms of s2's busy time, c 40 ms.
    assert s2.split == pytest.approx({(2, 2): 0.04 / 3, (3, 3): 0.08 / 3})
    assert sum(s2.split.values()) == pytest.approx(s2.gpu_seconds)


def test_a_ready_window_overlapping_a_waiting_one_waits_with_it():
    s = stage()
    a = finished(0, 60, (1, 1))
    w1 = window("shared", (20, 50), candidates=[(1, 1)], pid=2)
    w2 = window("shared", (40, 90), candidates=[(2, 2)], pid=2)  # overlaps w1; (2, 2) open
    assert s.process([a, w1, w2]) == [a]
    out = s.process([finished(30, 100, (2, 2))])
    assert w1 in out and w2 in out  # priced together: 40..50 split evenly
    assert w1.gpu_seconds == pytest.approx(0.025) and w2.gpu_seconds == pytest.approx(0.045)


def test_split_seconds_is_the_stretch_by_stretch_share():
    """Against a nanosecond-by-nanosecond count: each instant of the window is worth
    1 / (1 + the others covering it); others that touch, nest, repeat or lie outside."""
    rng = random.Random(23)
    for _ in range(300):
        start = rng.randrange(0, 50)
        window = (start, start + rng.randrange(0, 60))
        others = [(s, s + rng.randrange(-5, 40)) for s in (rng.randrange(-20, 120) for _ in range(rng.randrange(0, 8)))]
        others += rng.sample(others, min(len(others), 2))  # the same window twice
        exact = sum(1 / (1 + sum(1 for s, e in others if s <= t < e)) for t in range(*window))
        assert split_seconds(window, others) == pytest.approx(exact / 1e9, rel=1e-9, abs=1e-18), (window, others)
