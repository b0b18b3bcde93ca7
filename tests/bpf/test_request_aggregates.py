"""Past the per-request streaming budget (--stream-budget) the kernel counts CUDA calls
in req_agg instead of streaming them; the server span's aggregates still equal exactly
the calls the request made, and its children (one by one plus rollup counts) add up."""
from __future__ import annotations

import http.client
import threading

import pytest

from tests.harness import children_of, module_collector, server_spans, traced

BUDGET = 16
PAST = BUDGET + 37  # calls of each kind: well across the budget boundary


@pytest.fixture(scope="module")
def budgeted():
    """One collector with the budget for the module's tests: each checks its own target's
    spans, and a collector start and stop cost seconds (BPF compile, probe detach)."""
    with module_collector("--stream-budget", str(BUDGET)) as collector:
        yield collector


def _spans(receiver, pid, route, n):
    ok = receiver.wait_for(lambda spans: len([s for s in server_spans(spans, pid)
                                              if s.attributes.get("http.route") == route]) >= n)
    assert ok, f"expected {n} server spans for {route}"
    return [s for s in server_spans(receiver.spans, pid) if s.attributes.get("http.route") == route]


def _children_add_up(receiver, span, calls) -> int:
    """Asserts the span's children count its calls; returns those streamed one by one.
    Its children may come in the export batch after it (a request's spans go out
    together, its rollups last, and a batch holds 512): they are waited for, bounded."""
    def counted(spans) -> int:
        kids = children_of(spans, span)
        return sum(c.attributes.get("gpu.rollup.count", 1) for c in kids)
    receiver.wait_for(lambda spans: counted(spans) >= calls, timeout=15)
    kids = children_of(receiver.spans, span)
    single = [c for c in kids if "gpu.rollup.count" not in c.attributes]
    rolled = sum(c.attributes["gpu.rollup.count"] for c in kids if "gpu.rollup.count" in c.attributes)
    assert len(single) + rolled == calls == span.attributes["gpu.calls"]
    assert rolled > 0  # past the budget: some calls were counted, not streamed
    return len(single)


@pytest.mark.parametrize("kind", ["stdlib", "asgi"])  # thread and task (Python context) attribution
def test_counts_exact_across_the_budget(kind, budgeted, start_target):
    receiver, target = budgeted.receiver, traced(budgeted, start_target, kind=kind)
    target.get(f"/work?launches={PAST}&copies={PAST}&h2d=1000&d2h=300&syncs={PAST}")
    (span,) = _spans(receiver, target.pid, "/work", 1)
    a = span.attributes
    assert a["gpu.launches"] == PAST
    h2d, d2h = (PAST + 1) // 2, PAST // 2  # copies alternate, h2d first
    assert a["gpu.memcpy.h2d.bytes"] == 1000 * h2d
    assert a["gpu.memcpy.d2h.bytes"] == 300 * d2h
    assert a["gpu.calls"] == 3 * PAST
    _children_add_up(receiver, span, 3 * PAST)


def test_calls_on_another_thread_right_before_the_reply(budgeted, start_target):
    """/handoff: a fresh thread makes the calls and is joined just before the response is
    written: its counts are still in the kernel map when the write arrives."""
    receiver, target = budgeted.receiver, traced(budgeted, start_target)
    for _ in range(3):
        target.get(f"/handoff?launches={PAST}")
    spans = _spans(receiver, target.pid, "/handoff", 3)
    for s in spans:
        assert s.attributes["gpu.launches"] == PAST
        _children_add_up(receiver, s, PAST)


def test_each_keep_alive_request_streams_its_own_budget(budgeted, start_target):
    """One connection, so one server thread serves every request: past its budget the
    thread counts under a standing verdict (bpf/request_counts.c), which the next
    request's read ends. Each request streams its first BUDGET launches again."""
    receiver, target = budgeted.receiver, traced(budgeted, start_target)
    conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=20)
    for i in range(4):
        conn.request("GET", f"/work?launches={PAST}&n={i}")
        reply = conn.getresponse()
        reply.read()
        assert reply.status == 200
    conn.close()
    spans = _spans(receiver, target.pid, "/work", 4)
    for s in spans:
        assert _children_add_up(receiver, s, PAST) == BUDGET


def test_two_concurrent_requests_each_exact(budgeted, start_target):
    receiver, target = budgeted.receiver, traced(budgeted, start_target)
    counts = (PAST, 3 * PAST)
    errors = []

    def get(n):
        try:
            target.get(f"/work?launches={n}&meet=1")  # each waits for the other: both open together
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    for _ in range(3):
        threads = [threading.Thread(target=get, args=(n,)) for n in counts]
        for t in threads:
            t.start()
        for t in threads:
            t.join(30)
    assert not errors
    spans = _spans(receiver, target.pid, "/work", 6)
    assert sorted(s.attributes["gpu.launches"] for s in spans) == sorted(counts * 3)
    for s in spans:  # each overlapped the other request of its pair
        assert any(o is not s and o.start_ns < s.end_ns and s.start_ns < o.end_ns for o in spans)
    for s in spans:
        assert s.attributes.get("otel_gpu.calls.ambiguous", 0) == 0
        _children_add_up(receiver, s, s.attributes["gpu.launches"])
