"""Trace sampling on a real collector (issue 26): OTEL_TRACES_SAMPLER=traceidratio at 10 %
sends about a tenth of the traces over OTLP, while the Prometheus metrics and the local
store count every request; parentbased_traceidratio at 0 still sends the traces whose
incoming traceparent is sampled, and only those."""
from __future__ import annotations

import sqlite3
import time

from otel_gpu.demo.runner import free_port
from tests.bpf.load_client import fetch_all
from tests.bpf.test_metrics import _scrape, _value
from tests.harness import server_spans

N = 200


def _work(spans, pid):
    return [s for s in server_spans(spans, pid) if s.attributes["url.path"] == "/work"]


def test_a_tenth_of_the_traces_go_out_and_every_request_is_counted(tmp_path, receiver, start_collector,
                                                                   start_target):
    port, db = free_port(), str(tmp_path / "otel-gpu.db")
    collector = start_collector("--prometheus-port", str(port), OTEL_TRACES_SAMPLER="traceidratio",
                                OTEL_TRACES_SAMPLER_ARG="0.1", OTEL_GPU_STORE=db)
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    out = fetch_all(target.port, [f"/work?launches=2&n={i}" for i in range(N)], 4, 60)
    assert len(out.ok) == N
    deadline, text = time.monotonic() + 30, ""
    while time.monotonic() < deadline:
        text = _scrape(port)
        if _value(text, "http_server_request_duration_seconds_count", http_route="/work") >= N:
            break
        time.sleep(0.3)
    assert _value(text, "http_server_request_duration_seconds_count", http_route="/work") == N
    launches = _value(text, "gpu_cuda_kernel_launch_calls_total", http_route="/work")
    assert collector.stop() == 0
    # Once seen in CI and not since (16 of 400: no call counted in the kernel reached its
    # request): the run's counts, aggregates_late among them, say where they went.
    assert launches == 2 * N, f"{launches} launches counted; the collector's counts: {collector.counts()}"
    sent = _work(receiver.spans, target.pid)
    rows = sqlite3.connect(db).execute("SELECT COUNT(*) FROM requests WHERE route = '/work'").fetchone()[0]
    print(f"traceidratio 0.1: {len(sent)} of {N} traces sent over OTLP; {rows} requests in the store")
    assert 4 <= len(sent) <= 48 and rows == N  # binomial(200, 0.1): 20 +- 4.2
    assert all(s.attributes["gpu.launches"] == 2 for s in sent)


def test_a_sampled_parent_is_followed(receiver, start_collector, start_target):
    collector = start_collector(OTEL_TRACES_SAMPLER="parentbased_traceidratio", OTEL_TRACES_SAMPLER_ARG="0")
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    trace = "4bf92f3577b34da6a3ce929d0e0e4736"
    for i, flags in enumerate(("01", "00", "01", "00")):
        target.get(f"/work?launches=1&n={i}", {"traceparent": f"00-{trace}-00f067aa0ba902b{i}-{flags}"})
    target.get("/work?launches=1&n=9")  # no parent: the ratio, 0
    assert collector.stop() == 0
    sent = _work(receiver.spans, target.pid)
    assert sorted(s.attributes["url.query"] if "url.query" in s.attributes else s.parent_span_id for s in sent) \
        == ["00f067aa0ba902b0", "00f067aa0ba902b2"]


def test_unsampled_requests_calls_are_counted_in_the_kernel_not_streamed(tmp_path, receiver, start_collector,
                                                                         start_target):
    """traceidratio 0: no request is sampled, so the kernel counts every call in req_agg
    (quiet_procs) instead of streaming it; the requests' summaries stay exact."""
    from tests.bpf.targets.relia_support import stopped_counters
    db = str(tmp_path / "otel-gpu.db")
    collector = start_collector(OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0", OTEL_GPU_STORE=db)
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    out = fetch_all(target.port, [f"/work?launches=20&n={i}" for i in range(60)], 4, 60)
    assert len(out.ok) == 60
    assert collector.stop() == 0
    counted = stopped_counters(collector)
    launches = sqlite3.connect(db).execute("SELECT TOTAL(launches), COUNT(*) FROM requests WHERE route = '/work'"
                                           ).fetchone()
    streamed, kept = counted.get("cuda_calls_streamed", 0), counted.get("cuda_calls_counted", 0)
    print(f"traceidratio 0: {streamed} calls streamed, {kept} counted in the kernel; store: {launches}")
    assert launches == (1200, 60)
    assert kept >= 0.95 * 1200 and streamed <= 0.05 * 1200
    assert not _work(receiver.spans, target.pid)
