"""Per-request GPU cost from a real traced process: the cost ratio follows the work
ratio, and overlapping requests split their shared window."""
from __future__ import annotations

import threading

from tests.harness import server_spans, started


def _spans_for(receiver, pid, route, n):
    assert receiver.wait_for(lambda s: len([x for x in server_spans(s, pid) if x.attributes["url.path"] == route]) >= n)
    return [x for x in server_spans(receiver.spans, pid) if x.attributes["url.path"] == route]


def test_cost_follows_work_and_overlaps_split(receiver, start_collector, start_target):
    # 3.6 per GPU-hour = 0.001 per GPU-second
    collector, target = started(start_collector, start_target, "--gpu-price", "3.6")
    target.get("/cost?launches=2&hold_ms=40")
    target.get("/cost?launches=2&hold_ms=120")
    light, heavy = sorted(_spans_for(receiver, target.pid, "/cost", 2),
                          key=lambda s: s.attributes["otel_gpu.cost.gpu_seconds"])
    ratio = heavy.attributes["otel_gpu.cost.gpu_seconds"] / light.attributes["otel_gpu.cost.gpu_seconds"]
    assert 2.4 < ratio < 3.3, ratio  # 120 ms vs 40 ms of busy window, plus call overheads
    assert abs(heavy.attributes["otel_gpu.cost.amount"] - heavy.attributes["otel_gpu.cost.gpu_seconds"] * 0.001) < 1e-12
    assert heavy.attributes["otel_gpu.cost.currency"] == "USD"
    assert heavy.attributes["otel_gpu.feature"] == "/cost"
    assert heavy.attributes["gpu.device"] == 0

    threads = [threading.Thread(target=target.get, args=("/cost?launches=1&hold_ms=200&pair=1",)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    pair = [s for s in _spans_for(receiver, target.pid, "/cost", 4) if s not in (light, heavy)]
    assert len(pair) == 2
    for s in pair:
        # ~200 ms windows that overlap almost entirely: each pays about half.
        assert 0.09 < s.attributes["otel_gpu.cost.gpu_seconds"] < 0.14, s.attributes
    total = sum(s.attributes["otel_gpu.cost.gpu_seconds"] for s in pair)
    assert 0.19 < total < 0.26
