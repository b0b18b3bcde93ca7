"""Cost model: busy windows, overlap splitting, prices, and the hold-until-settled rule."""
from __future__ import annotations

import pytest

from otel_gpu.pipeline.cost import CostStage, Prices, split_seconds
from otel_gpu.pipeline.http_parser import RequestHead
from otel_gpu.pipeline.model import CallSink, Request
from otel_gpu.pipeline.records import BusyStarted, Tick
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


def test_request_is_held_while_an_overlapping_one_is_open():
    a, b = request(0, 100), request(50, 150)
    stage = CostStage(Prices("1", model=""), clock=lambda: 0.0)
    # The stitcher said both had begun GPU work; b started before a's window ended.
    assert stage.process([BusyStarted(a), BusyStarted(b), a]) == []
    out = stage.process([b])
    assert out == [a, b] or out == [b, a]
    assert a.gpu_seconds == pytest.approx(0.075)


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
    assert stage.process([BusyStarted(b), a]) == []
    now[0] = 31.0
    tick = Tick(1)
    assert stage.process([tick]) == [tick, a]  # released at the next Tick past the hold
    c = request(0, 100)
    assert stage.process([c]) == []  # b is still open
    final = Tick(2, final=True)
    assert stage.process([final]) == [c, final]


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
