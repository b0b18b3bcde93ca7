"""Device-clock mode in the pipeline (pipeline/device_times.py, pipeline/cost.py): each device
record is tied to the call that launched it, by its thread, its API and the time that call
entered, never by timing alone; a finished request waits for its calls' device times, and its
GPU seconds then come from the device's clock. Records and calls encode which request and
which launch they belong to, so a record tied to a wrong call fails a test."""
from __future__ import annotations

import pytest

from otel_gpu.device_clock.apis import DRIVER_DOMAIN, RUNTIME_DOMAIN
from otel_gpu.pipeline.busy_time import shared_seconds, union
from otel_gpu.pipeline.cost import CostStage, Prices
from otel_gpu.pipeline.device_times import DEVICE_WAIT_S, DeviceTimes, DeviceWait
from otel_gpu.pipeline.model import CallSink, Request
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.ratelimit import Stats
from otel_gpu.records import (DEVICE_KERNEL, DEVICE_MEMCPY, DEVICE_MEMSET, DeviceActivity, DeviceClockSeen,
                              DeviceRecords, ProcessGone, Tick)
from tests.unit.pipeline.calls import cuda

PID, US = 7, 1000
LAUNCH, MEMCPY_ASYNC, GRAPH_LAUNCH = (RUNTIME_DOMAIN, 211), (RUNTIME_DOMAIN, 41), (RUNTIME_DOMAIN, 311)
CU_LAUNCH, MEMSET = (DRIVER_DOMAIN, 307), (RUNTIME_DOMAIN, 49)


def activity(call, api, corr, kind=DEVICE_KERNEL, lag=2 * US, start=50 * US, length=None):
    """The device record of `call`: its API entered `lag` after the probe saw it; the device
    ran it from `start` after that, for a time that encodes the call (its grid's x)."""
    length = length if length is not None else call.grid[0] * US if hasattr(call, "grid") else 3 * US
    at = call.ts_ns + start
    return DeviceActivity(kind, at, at + length, call.ts_ns + lag, call.tid, api, corr, 7, 0)


def records(*activities, dropped=0):
    return DeviceRecords(PID, 0, tuple(activities), dropped)


def stage():
    stats = Stats()
    s = DeviceTimes(stats)
    s.process([DeviceClockSeen(PID)])
    return s, stats


def test_each_record_is_tied_to_its_own_call_on_its_thread():
    s, stats = stage()
    # Two threads launch in turn 10 us apart; launch i of thread t has grid x = 10 * t + i.
    calls = [cuda("cudaLaunchKernel", pid=PID, tid=100 + t, ts=(2 * i + t) * 10 * US, grid=(10 * t + i + 1, 1, 1))
             for i in range(4) for t in range(2)]
    s.process(calls)
    s.process([records(*(activity(c, LAUNCH, corr=n) for n, c in enumerate(reversed(calls))))])
    for c in calls:
        (start, end), = c.device_ns
        assert (start - c.ts_ns, end - start) == (50 * US, c.grid[0] * US)
    assert stats.snapshot().get("device_tied") == len(calls)


def test_a_record_is_not_tied_where_its_call_was_not_streamed_or_is_another():
    s, stats = stage()
    launch = cuda("cudaLaunchKernel", pid=PID, tid=1, ts=100 * US, grid=(5, 1, 1))
    copy = cuda("cudaMemcpyAsync", pid=PID, tid=1, ts=200 * US, nbytes=64, kind=1)
    s.process([launch, copy])
    untied = [
        activity(launch, (0, 0), 1),                             # unknown: no launching call
        activity(launch, MEMSET, 2, kind=DEVICE_MEMSET),         # api: cudaMemset is not probed
        activity(launch, LAUNCH, 3, lag=-50 * US),               # no_call: before the thread's first call
        activity(copy, LAUNCH, 4, lag=10 * US),                  # other_call: the thread's last call is a copy
        activity(launch, LAUNCH, 5, kind=DEVICE_MEMCPY),         # other_call: a copy record for a launch
    ]
    s.process([records(*untied)])
    assert launch.device_ns == copy.device_ns == ()
    assert {k: stats.snapshot().get(f"device_untied_{k}") for k in ("unknown", "api", "no_call", "other_call")} == \
        {"unknown": 1, "api": 1, "no_call": 1, "other_call": 2}
    s.process([records(activity(launch, LAUNCH, 6), activity(copy, MEMCPY_ASYNC, 7, kind=DEVICE_MEMCPY))])
    assert len(launch.device_ns) == len(copy.device_ns) == 1
    # A second record with another correlation id claims the launch: not tied (a launch makes one).
    s.process([records(activity(launch, LAUNCH, 8, lag=3 * US))])
    assert len(launch.device_ns) == 1 and stats.snapshot().get("device_untied_conflict") == 1


def test_a_driver_record_ties_to_the_runtime_launch_that_reached_the_driver():
    s, _ = stage()
    launch = cuda("cudaLaunchKernel", pid=PID, tid=1, ts=100 * US, grid=(9, 1, 1))
    s.process([launch])
    s.process([records(activity(launch, CU_LAUNCH, 1))])
    assert len(launch.device_ns) == 1


def test_a_graph_launch_takes_every_kernel_record_of_its_launch():
    s, stats = stage()
    graph = cuda("cudaGraphLaunch", pid=PID, tid=1, ts=100 * US, func=0xE0)
    graph.kernels = ((0xA, 2), (0xB, 1))
    s.process([graph])
    s.process([records(*(activity(graph, GRAPH_LAUNCH, 40, start=(10 + k) * US, length=US) for k in range(3)))])
    assert graph.device_ns == tuple((graph.ts_ns + (10 + k) * US, graph.ts_ns + (11 + k) * US) for k in range(3))
    assert stats.snapshot().get("device_tied") == 3


def test_calls_of_a_process_not_in_device_clock_mode_are_not_kept():
    s, _ = stage()
    s.process([cuda("cudaLaunchKernel", pid=PID + 1, tid=1, ts=10)])
    assert s.state()["device_timeline_calls"] == 0
    s.process([Tick(10**12)])  # and a Tick drops what is older than the timeline keeps


def request(calls, span_id=1):
    r = Request(PID, 1, 3, RequestHead("GET", "/a", "1.1", {}), calls[0].ts_ns, 1, span_id, CallSink(2))
    for c in calls:
        r.sink.add(c, "thread")
        r.busy.add(c, 0)
    r.end_ns = calls[-1].ts_ns + 1
    return r


class Clock:
    now = 0.0

    def __call__(self):
        return self.now


def test_a_request_waits_for_its_device_times_then_carries_them_all():
    clock, stats = Clock(), Stats()
    times, wait = DeviceTimes(stats), DeviceWait(stats, clock)
    calls = [cuda("cudaLaunchKernel", pid=PID, tid=1, ts=(i + 1) * 100 * US, grid=(i + 1, 1, 1)) for i in range(4)]
    for ev in ([DeviceClockSeen(PID)], calls):
        wait.process(times.process(ev))
    r = request(calls)  # past its span budget of 2: still every launch is kept for its device time
    assert wait.process([r]) == [] and wait.state() == {"held_for_device_times": 1}
    wait.process(times.process([records(*(activity(c, LAUNCH, i) for i, c in enumerate(calls[:3])))]))
    assert wait.process([]) == []  # one still missing
    out = wait.process(times.process([records(activity(calls[3], LAUNCH, 3))]))
    assert out == [r]
    assert sorted(e - s for s, e in r.device_busy) == [1 * US, 2 * US, 3 * US, 4 * US]


def test_a_request_whose_device_times_never_come_goes_on_with_the_host_estimate():
    clock, stats = Clock(), Stats()
    wait = DeviceWait(stats, clock)
    wait.process([DeviceClockSeen(PID)])
    r = request([cuda("cudaLaunchKernel", pid=PID, tid=1, ts=100 * US)])
    assert wait.process([r, Tick(0)]) == [Tick(0)]
    clock.now = DEVICE_WAIT_S + 0.1
    assert wait.process([Tick(1)]) == [r, Tick(1)]
    assert r.device_busy is None and stats.snapshot().get("device_times_late") == 1
    # A process that goes releases its requests at once.
    r2 = request([cuda("cudaLaunchKernel", pid=PID, tid=1, ts=100 * US)])
    assert wait.process([r2, ProcessGone(PID, "x")]) == [r2, ProcessGone(PID, "x")]


def test_a_request_with_counted_launches_keeps_the_host_estimate():
    stats = Stats()
    times, wait = DeviceTimes(stats), DeviceWait(stats)
    launch = cuda("cudaLaunchKernel", pid=PID, tid=1, ts=100 * US)
    wait.process(times.process([DeviceClockSeen(PID), launch]))
    r = request([launch])
    r.sink.add_aggregate(launch.call, 0x1000, 5, 0, 0, 200 * US, "thread")  # 5 launches counted in the kernel
    wait.process(times.process([records(activity(launch, LAUNCH, 1))]))
    assert wait.process([r]) == [r] and r.device_busy is None
    assert stats.snapshot().get("device_times_partial") == 1


def test_device_seconds_are_the_union_with_shared_stretches_split():
    assert union([(5, 9), (0, 3), (2, 4), (9, 10)]) == [(0, 4), (5, 10)]
    ms = 10**6
    assert shared_seconds([(0, 10 * ms), (5 * ms, 20 * ms)], []) == pytest.approx(0.020)
    # Another request's kernels ran during 10..30 ms: that stretch is halved.
    assert shared_seconds([(0, 20 * ms)], peers=[((10 * ms, 30 * ms),)]) == pytest.approx(0.015)
    assert shared_seconds([], peers=[((0, ms),)]) == 0.0
    # What an owner priced before took is not charged again (a window after its requests).
    assert shared_seconds([(0, 20 * ms)], taken=[(5 * ms, 10 * ms)], peers=[((15 * ms, 30 * ms),)]) == \
        pytest.approx(0.0125)


def test_cost_comes_from_the_device_where_every_launch_was_timed():
    ms = 10**6
    cost = CostStage(Prices("3.6", model=""), clock=lambda: 0.0)
    a = request([cuda("cudaLaunchKernel", pid=PID, tid=1, ts=0), cuda("cudaLaunchKernel", pid=PID, tid=1, ts=ms)])
    b = request([cuda("cudaLaunchKernel", pid=PID, tid=2, ts=0)], span_id=2)
    host = request([cuda("cudaLaunchKernel", pid=PID, tid=3, ts=0), cuda("cudaDeviceSynchronize", pid=PID, tid=3,
                                                                          ts=ms, duration=99 * ms)], span_id=3)
    a.device_busy = ((2 * ms, 6 * ms), (5 * ms, 8 * ms))   # 6 ms of device time
    b.device_busy = ((6 * ms, 10 * ms),)                   # 4 ms, 2 of them alongside a's
    cost.process([a, b, host])
    assert (a.cost_source, b.cost_source, host.cost_source) == ("device", "device", "host_window")
    assert a.gpu_seconds == pytest.approx(0.005) and b.gpu_seconds == pytest.approx(0.003)
    assert a.gpu_seconds + b.gpu_seconds == pytest.approx(0.008)  # the union of both
    assert a.cost == pytest.approx(0.005 * 3.6 / 3600)


def test_a_process_whose_library_stays_silent_stops_holding_its_requests():
    """The library is mapped (DeviceClockSeen) but no record ever comes (CUPTI held by a
    profiler): one request waits out DEVICE_WAIT_S, the next ones go at once, until records come."""
    clock, stats = Clock(), Stats()
    wait = DeviceWait(stats, clock)
    wait.process([DeviceClockSeen(PID)])
    first = request([cuda("cudaLaunchKernel", pid=PID, tid=1, ts=100 * US)])
    assert wait.process([first]) == []
    clock.now = DEVICE_WAIT_S + 0.1
    assert wait.process([Tick(1)]) == [first, Tick(1)] and first.device_busy is None
    second = request([cuda("cudaLaunchKernel", pid=PID, tid=1, ts=200 * US)])
    assert wait.process([second]) == [second]  # not held
    wait.process([records()])  # a hand-off: it speaks after all
    third = request([cuda("cudaLaunchKernel", pid=PID, tid=1, ts=300 * US)])
    assert wait.process([third]) == []


def test_a_window_gets_the_device_time_no_request_took():
    """An outside window whose kernel ran partly while a request's did: the request, priced
    first, keeps the shared stretch (as on the host model); the window gets the rest, and
    request + window = the union of the device's busy time."""
    from otel_gpu.pipeline.model import ProcessWindow
    ms = 10**6
    cost = CostStage(Prices("3.6", model=""), clock=lambda: 0.0)
    r = request([cuda("cudaLaunchKernel", pid=PID, tid=1, ts=0)])
    r.device_busy = ((2 * ms, 6 * ms),)
    sink = CallSink(8)
    launch = cuda("cudaLaunchKernel", pid=PID, tid=9, ts=ms)
    sink.add(launch, "outside")
    w = ProcessWindow(PID, "outside", ms, ms, sink)
    w.device_busy = ((4 * ms, 10 * ms),)
    out = cost.process([r, w, Tick(0)])
    assert (r.cost_source, w.cost_source) == ("device", "device")
    assert r.gpu_seconds == pytest.approx(0.004) and w.gpu_seconds == pytest.approx(0.004)  # 6..10 ms
    assert r.gpu_seconds + w.gpu_seconds == pytest.approx(0.008)  # the union, 2..10 ms
    assert w in out


def test_windows_wait_for_device_times_too():
    stats = Stats()
    times, wait = DeviceTimes(stats), DeviceWait(stats)
    from otel_gpu.pipeline.model import ProcessWindow
    launch = cuda("cudaLaunchKernel", pid=PID, tid=1, ts=100 * US, grid=(3, 1, 1))
    wait.process(times.process([DeviceClockSeen(PID), launch]))
    sink = CallSink(8)
    sink.add(launch, "ambiguous")
    w = ProcessWindow(PID, "ambiguous", launch.ts_ns, launch.ts_ns, sink)
    assert wait.process([w]) == []
    assert wait.process(times.process([records(activity(launch, LAUNCH, 1))])) == [w]
    assert w.device_busy == launch.device_ns


def test_the_wait_looks_again_at_a_process_only_for_its_records_and_lets_the_oldest_go_in_time():
    """Requests of two processes held: records of one release its complete requests only; as
    time passes the oldest goes late without a Tick; a silent process lets all its held go."""
    clock, stats = Clock(), Stats()
    times, wait = DeviceTimes(stats), DeviceWait(stats, clock)
    other = PID + 1
    a = cuda("cudaLaunchKernel", pid=PID, tid=1, ts=100 * US, grid=(2, 1, 1))
    b = cuda("cudaLaunchKernel", pid=other, tid=1, ts=100 * US)
    wait.process(times.process([DeviceClockSeen(PID), DeviceClockSeen(other), a, b]))
    ra, rb = request([a]), request([b])
    rb.tgid = other
    rb2 = request([cuda("cudaLaunchKernel", pid=other, tid=1, ts=200 * US)])
    rb2.tgid = other
    assert wait.process([ra, rb]) == []
    clock.now = 1.0
    assert wait.process([rb2]) == []
    assert wait.process(times.process([records(activity(a, LAUNCH, 1))])) == [ra]
    assert wait.state() == {"held_for_device_times": 2}
    clock.now = DEVICE_WAIT_S + 0.1  # rb is due, rb2 not yet: but its process is found silent
    assert wait.process([]) == [rb, rb2]
    assert stats.snapshot()["device_times_late"] == 2 and wait.state() == {"held_for_device_times": 0}
