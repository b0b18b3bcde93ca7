"""Requests to real servers doing real libcudart calls become SERVER spans with
exactly the CUDA children they caused, sent over OTLP/gRPC."""
from __future__ import annotations

import threading

import pytest

from tests.harness import children_of, server_spans, started, traced

GRID, BLOCK = [7, 3, 1], [128, 2, 1]


def _wait_requests(receiver, pid, route, n):
    ok = receiver.wait_for(lambda spans: len([s for s in server_spans(spans, pid)
                                              if s.attributes.get("http.route") == route]) >= n)
    assert ok, f"expected {n} server spans for {route}"
    return [s for s in server_spans(receiver.spans, pid) if s.attributes.get("http.route") == route]


@pytest.mark.parametrize("kind", ["stdlib", "wsgi", "asgi"])
def test_n_requests_with_known_work(kind, receiver, start_collector, start_target):
    n, k, m = 3, 5, 4
    collector, target = started(start_collector, start_target, kind=kind)
    for i in range(n):
        target.get(f"/work?launches={k}&copies={m}&h2d={1000 + i}&d2h=300")
    spans = _wait_requests(receiver, target.pid, "/work", n)
    collector.stop()
    assert len(spans) == n
    for s in spans:
        assert s.name == "GET /work"
        assert s.attributes["http.request.method"] == "GET"
        assert s.attributes["http.response.status_code"] == 200
        assert s.attributes["server.port"] == target.port
        assert s.attributes["client.address"] == "127.0.0.1"
        assert s.attributes["network.protocol.version"] == "1.1"
        assert "url.query" not in s.attributes  # privacy by default
        assert s.attributes["gpu.launches"] == k
        assert s.attributes["gpu.kernels.distinct"] == 1
        h2d = s.attributes["gpu.memcpy.h2d.bytes"]
        assert h2d in {2 * (1000 + i) for i in range(n)}
        assert s.attributes["gpu.memcpy.d2h.bytes"] == 2 * 300
        kids = children_of(receiver.spans, s)
        launches = [c for c in kids if c.name == "cudaLaunchKernel"]
        copies = [c for c in kids if c.name == "cudaMemcpy"]
        assert len(kids) == k + m
        assert len(launches) == k and len(copies) == m
        for c in launches:
            assert c.attributes["gpu.grid"] == GRID and c.attributes["gpu.block"] == BLOCK
            assert c.attributes["gpu.shared_memory.bytes"] == 256
            assert c.attributes["gpu.kernel.name"] == "matmul_tile(float const*, float const*, float*, int)"
            # An asyncio request runs in its own task: attributed by its Python context.
            assert c.attributes["otel_gpu.attribution"] == ("task" if kind == "asgi" else "thread")
            assert c.attributes["gpu.timing"] == "host_enqueue"
        assert sorted(c.attributes["gpu.memcpy.direction"] for c in copies) == ["d2h", "d2h", "h2d", "h2d"]
        assert {c.attributes["gpu.memcpy.bytes"] for c in copies if c.attributes["gpu.memcpy.direction"] == "d2h"} == {300}
        assert all(s.start_ns <= c.start_ns <= s.end_ns for c in kids)
        assert s.resource["service.name"] == "cuda_http"
        assert s.resource["process.pid"] == target.pid


def test_concurrent_requests_are_flagged_ambiguous_not_guessed(receiver, start_collector, start_target):
    collector, target = started(start_collector, start_target)
    threads = [threading.Thread(target=target.get, args=("/together?launches=2",)) for _ in range(2)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    spans = _wait_requests(receiver, target.pid, "/together", 2)
    collector.stop()  # flushes the ambiguous window
    for s in spans:
        assert children_of(receiver.spans, s) == []
        assert 0 < s.attributes["otel_gpu.calls.ambiguous"] < 4  # a share of the 4, by overlap
        assert s.attributes["gpu.launches"] == 0
    # Split among the 2 candidates by how long each was open while the calls were made
    # (half each when they overlap exactly): the shares add up to the 4 calls.
    assert sum(s.attributes["otel_gpu.calls.ambiguous"] for s in spans) == pytest.approx(4)
    windows = [s for s in receiver.spans if s.attributes.get("otel_gpu.attribution") == "ambiguous"
               and s.attributes.get("process.pid") == target.pid and s.parent_span_id == ""]
    assert sum(w.attributes["gpu.launches"] for w in windows) == 4, ([(s.name, s.attributes) for s in receiver.spans if s.parent_span_id == ""], collector.log.lines)
    linked = {sid for w in windows for _, sid in w.links}
    assert linked == {s.span_id for s in spans}


def test_span_budget_rolls_up_and_counts_add_up(receiver, start_collector, start_target):
    collector, target = started(start_collector, start_target, "--span-budget", "5")
    target.get("/work?launches=12")
    (span,) = _wait_requests(receiver, target.pid, "/work", 1)
    kids = children_of(receiver.spans, span)
    single = [c for c in kids if "gpu.rollup.count" not in c.attributes]
    rolled = [c for c in kids if "gpu.rollup.count" in c.attributes]
    assert len(single) == 5
    assert sum(c.attributes["gpu.rollup.count"] for c in rolled) == 7
    assert span.attributes["gpu.launches"] == 12
    assert span.attributes["otel_gpu.spans.rolled_up"] == 7


def test_otlp_http_protobuf_exporter(start_target):
    """OTEL_EXPORTER_OTLP_PROTOCOL=http/protobuf: the SDK's HTTP exporter, to a real
    OTLP/HTTP receiver."""
    from tests.support.otlp_receiver import OtlpHttpReceiver
    from tests.harness import RunningCollector, check_clean
    http_receiver = OtlpHttpReceiver().start()
    collector = RunningCollector(http_receiver, [], {"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf"})
    try:
        target = start_target()
        collector.wait_traced(target.pid)
        target.go()
        target.get("/work?launches=2")
        (span,) = _wait_requests(http_receiver, target.pid, "/work", 1)
        assert span.attributes["gpu.launches"] == 2
        assert len(children_of(http_receiver.spans, span)) == 2
        collector.stop()
        check_clean(collector)
    finally:
        collector.stop()
        http_receiver.stop()


# Last in the module: these two share one collector (shared_collector).
def test_traceparent_continues_the_callers_trace(shared_collector, start_target):
    receiver, target = shared_collector.receiver, traced(shared_collector, start_target)
    trace_id, parent = "4bf92f3577b34da6a3ce929d0e0e4736", "00f067aa0ba902b7"
    target.get("/work?launches=1", headers={"traceparent": f"00-{trace_id}-{parent}-01"})
    (span,) = _wait_requests(receiver, target.pid, "/work", 1)
    assert span.trace_id == trace_id and span.parent_span_id == parent
    (kid,) = children_of(receiver.spans, span)
    assert kid.trace_id == trace_id


def test_handoff_to_another_thread_with_one_request_in_flight(shared_collector, start_target):
    receiver, target = shared_collector.receiver, traced(shared_collector, start_target)
    target.get("/handoff?launches=3")
    (span,) = _wait_requests(receiver, target.pid, "/handoff", 1)
    kids = children_of(receiver.spans, span)
    assert len(kids) == 3
    assert {c.attributes["otel_gpu.attribution"] for c in kids} == {"process"}
    assert all(c.attributes["thread.id"] != span.attributes["thread.id"] for c in kids)
