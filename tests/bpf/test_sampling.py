"""Trace sampling on a real collector (issue 26): OTEL_TRACES_SAMPLER=traceidratio at 10 %
sends about a tenth of the traces over OTLP, while the Prometheus metrics and the local
store count every request; parentbased_traceidratio at 0 still sends the traces whose
incoming traceparent is sampled, and only those."""
from __future__ import annotations

import sqlite3

import pytest
import time

from otel_gpu.demo.runner import free_port
from tests.bpf.load_client import fetch_all
from tests.bpf.test_metrics import _scrape, _value
from tests.harness import children_of, server_spans

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


def test_each_request_streams_by_its_own_sampling_under_concurrency(tmp_path, receiver, start_collector,
                                                                    start_target):
    """traceidratio 0.5, 8 keep-alive clients at once: the kernel decides each request as
    its head is read (bpf/head_sampling.c), so a sampled request's calls are streamed one by
    one, each a child span of its own request, and an unsampled one's are only counted,
    whatever else is open. (Deciding per process, one sampled request open made every
    request's calls stream.) Each request launches 2-5 kernels by its number."""
    from tests.bpf.targets.relia_support import stopped_counters
    n, db = 240, str(tmp_path / "otel-gpu.db")
    collector = start_collector("--export-query", OTEL_TRACES_SAMPLER="traceidratio", OTEL_TRACES_SAMPLER_ARG="0.5",
                                OTEL_GPU_STORE=db)
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    out = fetch_all(target.port, [f"/work?launches={2 + i % 4}&n={i}" for i in range(n)], 8, 60)
    assert len(out.ok) == n
    assert collector.stop() == 0
    counted = stopped_counters(collector)
    sent = _work(receiver.spans, target.pid)
    streamed = 0
    for span in sent:
        own = 2 + int(span.attributes["url.query"].split("n=")[1]) % 4
        kids = [k for k in children_of(receiver.spans, span) if k.name.startswith("cudaLaunchKernel")]
        assert [k.attributes.get("gpu.rollup.count", 1) for k in kids] == [1] * own, span.attributes["url.query"]
        streamed += own
    rows = sqlite3.connect(db).execute("SELECT TOTAL(launches), COUNT(*) FROM requests WHERE route = '/work'"
                                       ).fetchone()
    print(f"traceidratio 0.5, 8 clients: {len(sent)} of {n} sampled, {streamed} launches of theirs; "
          f"{counted.get('cuda_calls_streamed', 0)} calls streamed, {counted.get('cuda_calls_counted', 0)} counted")
    assert rows == (sum(2 + i % 4 for i in range(n)), n)
    assert 60 <= len(sent) <= 180  # binomial(240, 0.5): 120 +- 7.7
    assert counted.get("cuda_calls_streamed", 0) == streamed and not counted.get("cuda_calls_streamed_unsampled")


def test_a_head_with_a_traceparent_is_left_to_the_collector(receiver, start_collector, start_target):
    """parentbased_traceidratio 0.5, 8 clients at once, every other request carrying a
    traceparent (sampled or not by turns): the kernel decides the roots alone (its counter
    says how many), leaves every head with a parent to the collector, and the parent
    decides those: none of the roots' unsampled calls is streamed."""
    from tests.bpf.targets.relia_support import stopped_counters
    n, trace = 240, "4bf92f3577b34da6a3ce929d0e0e4736"
    collector = start_collector("--export-query", OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                                OTEL_TRACES_SAMPLER_ARG="0.5")
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()

    def parent(path: str) -> dict:
        i = int(path.split("n=")[1])
        return {"traceparent": f"00-{trace}-{i + 1:016x}-0{i // 2 % 2}"} if i % 2 else {}

    out = fetch_all(target.port, [f"/work?launches=3&n={i}" for i in range(n)], 8, 60, headers=parent)
    assert len(out.ok) == n
    assert collector.stop() == 0
    counted = stopped_counters(collector)
    sent = {int(s.attributes["url.query"].split("n=")[1]) for s in _work(receiver.spans, target.pid)}
    roots_sent = {i for i in sent if i % 2 == 0}
    print(f"parentbased_traceidratio 0.5: {len(roots_sent)} of {n // 2} roots sampled; "
          f"{counted.get('cuda_calls_streamed', 0)} calls streamed; heads decided in the kernel "
          f"{counted.get('heads_sampled_in_kernel', 0)}, here {counted.get('heads_sampled_here', 0)}")
    assert sent - roots_sent == {i for i in range(1, n, 2) if i // 2 % 2}  # the parents' flags, exactly
    roots = counted["requests"] - n // 2  # the harness's own request (target.go) is a root too
    assert counted.get("heads_sampled_in_kernel", 0) == roots and counted.get("heads_sampled_here", 0) == n // 2
    # Streamed: every sampled root's calls; at most the calls of the requests with a parent too.
    assert 3 * len(roots_sent) <= counted.get("cuda_calls_streamed", 0) <= 3 * (len(roots_sent) + n // 2)


def test_a_go_requests_goroutine_streams_by_its_own_sampling(receiver, start_collector):
    """The same on a Go net/http server (newest toolchain, GOMAXPROCS 4, built by the
    tests): the kernel's decision holds for the goroutine that read the head's end, on
    whatever thread it runs (goroutines park between calls and move); net/http's background
    read often takes a head's first byte alone. Each request launches with its id in the
    grid, then copies its id's bytes."""
    from otel_gpu.demo.cuda_work import find_cudart
    from tests.bpf.targets.go.build import build, toolchains
    from tests.bpf.targets.relia_support import stopped_counters
    from tests.harness import Target
    chains = toolchains()
    if not chains:
        pytest.skip("no Go toolchain under .go/ (scripts/setup.sh installs them)")
    newest = max(chains, key=lambda v: tuple(map(int, v.split("."))))
    n, k = 160, 3
    collector = start_collector("--export-query", "--stream-rate", "1000000", OTEL_TRACES_SAMPLER="traceidratio",
                                OTEL_TRACES_SAMPLER_ARG="0.5")
    target = Target([str(build("server.go", chains[newest], False)), find_cudart(), "0"], {"GOMAXPROCS": "4"})
    try:
        collector.wait_traced(target.pid)
        target.go()
        out = fetch_all(target.port, [f"/infer?id={i}&launches={k}&mode=handler" for i in range(1, n + 1)], 8, 60)
        assert len(out.ok) == n and not out.errors, out.errors[:5]
    finally:
        target.stop()
    assert collector.stop() == 0
    counted = stopped_counters(collector)
    sent = [s for s in server_spans(receiver.spans, target.pid) if s.attributes["url.path"] == "/infer"]
    for span in sent:
        own = int(span.attributes["url.query"].split("id=")[1].split("&")[0])
        kids = [c for c in children_of(receiver.spans, span) if c.name.startswith("cudaLaunchKernel")]
        assert [(c.attributes.get("gpu.rollup.count", 1), (c.attributes.get("gpu.grid") or [None])[0])
                for c in kids] == [(1, own)] * k, (own, [dict(c.attributes) for c in kids])
    print(f"go{newest} traceidratio 0.5, 8 clients: {len(sent)} of {n} sampled; "
          f"{counted.get('cuda_calls_streamed', 0)} calls streamed, {counted.get('cuda_calls_counted', 0)} counted")
    assert 40 <= len(sent) <= 120  # binomial(160, 0.5): 80 +- 6.3
    assert counted.get("cuda_calls_streamed", 0) == (k + 1) * len(sent)  # and a copy of id bytes each
