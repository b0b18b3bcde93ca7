"""Trace sampling on a real collector (issue 26), 8 keep-alive clients at once: at 10 %
(traceidratio) about a tenth of the traces go out over OTLP while the Prometheus metrics
and the local store count every request (the store keeps the sampled ones whole and sums
the rest); the kernel decides each root request as its
head is read (bpf/head_sampling.c), so a sampled request's calls stream one by one, each
a child span of its own request, and an unsampled one's are only counted, whatever else
is open; under parentbased_traceidratio the incoming traceparent decides, in the kernel
where it is canonical; under the default sampler the kernel decides from the first
unsampled parent on. Each request's launch count encodes its number."""
from __future__ import annotations

import json
import sqlite3
import time

import pytest
from opentelemetry.trace import SpanKind

from otel_gpu.demo.runner import free_port
from otel_gpu.store.report import build_report
from tests.bpf.load_client import fetch_all
from tests.bpf.targets.relia_support import stopped_counters
from tests.bpf.test_metrics import _scrape, _value
from tests.harness import children_of, server_spans

N = 240
CLIENTS = 8
KERNEL_DECIDES = "sampling decided in the kernel as heads are read"  # the head programs run (logged once)


def _work(spans, pid):
    return [s for s in server_spans(spans, pid) if s.attributes["url.path"] == "/work"]


def _number(span) -> int:
    return int(span.attributes["url.query"].split("n=")[1])


def _own(i: int) -> int:
    return 2 + i % 4


def _run(collector, target, receiver, db: str, launches, parent) -> tuple:
    """N requests, CLIENTS at once (request i makes launches(i) launches, with parent(path)'s
    headers), then the collector stopped: its counts, the /work server spans it sent by
    request number, and the store's (launches, requests) of /work."""
    out = fetch_all(target.port, [f"/work?launches={launches(i)}&n={i}" for i in range(N)], CLIENTS, 60,
                    headers=parent)
    assert len(out.ok) == N
    assert collector.stop() == 0
    sent = {_number(s): s for s in _work(receiver.spans, target.pid)}
    rows = _store_rows(db)
    return stopped_counters(collector), sent, rows


def _store_rows(db: str) -> tuple:
    """The local store's (launches, requests) of /work as `otel-gpu report` counts them: the
    requests it kept whole (sampled; none of these ends in an error) and those it summed."""
    row, = [r for r in build_report(sqlite3.connect(db))["rows"] if r["feature"] == "/work"]
    return round(row["launches_per_request"] * row["requests"]), row["requests"]


def _kept_whole(db: str) -> set:
    """The numbers (n=) of the /work requests the store kept as a row and spans, read from
    their server spans' url.query."""
    conn = sqlite3.connect(db)
    kept = {int(a["url.query"].split("n=")[1]) for a in
            (json.loads(t) for t, in conn.execute("SELECT attributes FROM spans WHERE kind = ?",
                                                   (SpanKind.SERVER.value,)))
            if a.get("url.path") == "/work"}
    assert len(kept) == conn.execute("SELECT COUNT(*) FROM requests WHERE route = '/work'").fetchone()[0]
    return kept


def _launches_one_by_one(receiver, span) -> list:
    """The rollup count of each launch child of `span`: 1 for a launch streamed alone."""
    kids = [k for k in children_of(receiver.spans, span) if k.name.startswith("cudaLaunchKernel")]
    return [k.attributes.get("gpu.rollup.count", 1) for k in kids]


def _metric_when_counted(port: int, want: int) -> str:
    deadline, text = time.monotonic() + 30, ""
    while time.monotonic() < deadline:
        text = _scrape(port)
        if _value(text, "http_server_request_duration_seconds_count", http_route="/work") >= want:
            break
        time.sleep(0.3)
    return text


@pytest.mark.parametrize("kind", ["stdlib", "asgi"])
def test_a_tenth_of_the_traces_go_out_each_streaming_only_its_own_calls(tmp_path, receiver, start_collector,
                                                                        start_target, kind):
    """traceidratio 0.1; every 4th request carries a traceparent, whose trace id decides
    (the kernel reads it from the head as the collector does). On the stdlib server the
    thread that reads a head makes its calls; on uvicorn the request's asyncio task does,
    in a context copied from the one that read the head (bpf/python_probes.c)."""
    port, db = free_port(), str(tmp_path / "otel-gpu.db")
    collector = start_collector("--prometheus-port", str(port), "--export-query", OTEL_TRACES_SAMPLER="traceidratio",
                                OTEL_TRACES_SAMPLER_ARG="0.1", OTEL_GPU_STORE=db)
    target = start_target(kind)
    collector.wait_traced(target.pid)
    assert collector.log.wait_for(KERNEL_DECIDES, 60)  # verified after `ready`: until then the collector decides
    target.go()

    def parent(path: str) -> dict:  # every 4th request continues a trace, which its trace id decides
        i = int(path.split("n=")[1])
        trace_id = (i + 1) * 0x9E3779B97F4A7C15F39CC0605CEDC835 % (1 << 128)
        return {"traceparent": f"00-{trace_id:032x}-{i + 1:016x}-01"} if i % 4 == 3 else {}

    out = fetch_all(target.port, [f"/work?launches={_own(i)}&n={i}" for i in range(N)], CLIENTS, 60,
                    headers=parent)
    assert len(out.ok) == N
    text = _metric_when_counted(port, N)
    assert _value(text, "http_server_request_duration_seconds_count", http_route="/work") == N
    launches = _value(text, "gpu_cuda_kernel_launch_calls_total", http_route="/work")
    assert collector.stop() == 0
    counted = stopped_counters(collector)
    # Once seen in CI and not since (16 of 400: no call counted in the kernel reached its
    # request): the run's counts, aggregates_late among them, say where they went.
    assert launches == sum(map(_own, range(N))), f"{launches} launches counted; the collector's counts: {counted}"
    rows = _store_rows(db)
    assert rows == (sum(map(_own, range(N))), N)
    sent = _work(receiver.spans, target.pid)
    assert _kept_whole(db) == {_number(s) for s in sent}  # the rest summed (#45's decision)
    for span in sent:  # every launch of its own, one by one: none counted away, none another's
        assert _launches_one_by_one(receiver, span) == [1] * _own(_number(span)), _number(span)
    streamed = sum(_own(_number(s)) for s in sent)
    print(f"traceidratio 0.1, {CLIENTS} clients: {len(sent)} of {N} traces sent over OTLP, {streamed} launches "
          f"of theirs; {counted.get('cuda_calls_streamed', 0)} calls streamed, "
          f"{counted.get('cuda_calls_counted', 0)} counted; store {rows}")
    assert 5 <= len(sent) <= 50  # binomial(240, 0.1): 24 +- 4.6
    assert counted.get("cuda_calls_streamed", 0) == streamed and not counted.get("cuda_calls_streamed_unsampled")
    assert counted.get("heads_sampled_here", 0) == 0  # roots and traceparents alike, decided in the kernel
    # (Before the kernel decided per request, one sampled request open made every request's calls stream.)


def test_a_traceparent_decides_and_roots_at_ratio_0_are_only_counted(tmp_path, receiver, start_collector,
                                                                     start_target):
    """parentbased_traceidratio 0: every other request carries a traceparent, sampled or
    not by turns; one in four of those in uppercase hex, which the collector accepts and
    the kernel leaves to it (it decides canonical ones only). Exactly the requests whose
    parent is sampled go out, under their parent; the kernel decides the roots (none
    sampled: counted, never streamed) and the canonical parents, whose sampled requests
    stream exactly their own calls; the store counts every request."""
    trace, db = "4bf92f3577b34da6a3ce929d0e0e4736", str(tmp_path / "otel-gpu.db")
    # The rate lifted: ratio 0's default (the floor) would count some parents' calls away.
    collector = start_collector("--export-query", "--stream-rate", "1000000",
                                OTEL_TRACES_SAMPLER="parentbased_traceidratio",
                                OTEL_TRACES_SAMPLER_ARG="0", OTEL_GPU_STORE=db)
    target = start_target()
    collector.wait_traced(target.pid)
    assert collector.log.wait_for(KERNEL_DECIDES, 60)
    target.go()
    upper = {i for i in range(N) if i % 8 == 7}

    def parent(path: str) -> dict:
        i = int(path.split("n=")[1])
        value = f"00-{trace}-{i:016x}-0{i // 2 % 2}"
        return {"traceparent": value.upper() if i in upper else value} if i % 2 else {}

    counted, sent, rows = _run(collector, target, receiver, db, lambda i: 3, parent)
    streamed = counted.get("cuda_calls_streamed", 0)
    print(f"parentbased_traceidratio 0: {len(sent)} sent; {streamed} calls streamed, "
          f"{counted.get('cuda_calls_counted', 0)} counted; heads decided in the kernel "
          f"{counted.get('heads_sampled_in_kernel', 0)}, here {counted.get('heads_sampled_here', 0)}; store {rows}")
    assert set(sent) == {i for i in range(1, N, 2) if i // 2 % 2}  # the parents' flags, exactly
    assert all(s.parent_span_id == f"{i:016x}" for i, s in sent.items())
    assert counted.get("heads_sampled_here", 0) == len(upper)
    assert counted.get("heads_sampled_in_kernel", 0) == counted["requests"] - len(upper)  # target.go's too
    assert rows == (3 * N, N) and _kept_whole(db) == set(sent)
    decided = [s for i, s in sent.items() if i not in upper]
    for span in decided:  # its own calls, one by one
        assert _launches_one_by_one(receiver, span) == [1, 1, 1], _number(span)
    # Streamed beyond those: only the requests the collector decided (per process, as before).
    assert 3 * len(decided) <= streamed <= 3 * (len(decided) + len(upper))


def test_a_go_requests_goroutine_streams_by_its_own_sampling(receiver, start_collector):
    """The same on a Go net/http server (newest toolchain, GOMAXPROCS 4, built by the
    tests): the kernel's decision holds for the goroutine that read the head's end, on
    whatever thread it runs (goroutines park between calls and move); net/http's background
    read often takes a head's first byte alone. Each request launches with its id in the
    grid, then copies its id's bytes."""
    from otel_gpu.demo.cuda_work import find_cudart
    from tests.bpf.targets.go.build import build, toolchains
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
        out = fetch_all(target.port, [f"/infer?id={i}&launches={k}&mode=handler" for i in range(1, n + 1)],
                        CLIENTS, 60)
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
    print(f"go{newest} traceidratio 0.5, {CLIENTS} clients: {len(sent)} of {n} sampled; "
          f"{counted.get('cuda_calls_streamed', 0)} calls streamed, {counted.get('cuda_calls_counted', 0)} counted")
    assert 40 <= len(sent) <= 120  # binomial(160, 0.5): 80 +- 6.3
    assert counted.get("cuda_calls_streamed", 0) == (k + 1) * len(sent)  # and a copy of id bytes each


def test_under_the_default_sampler_an_unsampled_parent_has_the_kernel_decide(tmp_path, receiver, start_collector,
                                                                             start_target):
    """parentbased_always_on, the default, samples every root: the kernel has nothing to
    decide until a request arrives whose traceparent says "not sampled" (a service behind
    a sampling gateway). That loads the head programs; from then on roots and sampled
    parents stream exactly their own calls, and unsampled parents' calls are counted in
    the kernel, whatever else is open, their traces not sent; the store counts every
    request."""
    trace, db = "4bf92f3577b34da6a3ce929d0e0e4736", str(tmp_path / "otel-gpu.db")
    collector = start_collector("--export-query", OTEL_GPU_STORE=db)
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    target.get("/work?launches=3&n=1000", {"traceparent": f"00-{trace}-{1000:016x}-00"})
    assert collector.log.wait_for(KERNEL_DECIDES, 60)

    def parent(path: str) -> dict:  # by turns: a root, a sampled parent, an unsampled one
        i = int(path.split("n=")[1])
        return {"traceparent": f"00-{trace}-{i + 1:016x}-0{i % 3 % 2}"} if i % 3 else {}

    counted, sent, rows = _run(collector, target, receiver, db, _own, parent)
    print(f"parentbased_always_on: {len(sent)} sent; {counted.get('cuda_calls_streamed', 0)} calls streamed, "
          f"{counted.get('cuda_calls_streamed_unsampled', 0)} of unsampled requests; heads decided in the kernel "
          f"{counted.get('heads_sampled_in_kernel', 0)}; store {rows}")
    assert set(sent) == {i for i in range(N) if i % 3 != 2}
    for i, span in sent.items():  # its own calls, one by one
        assert _launches_one_by_one(receiver, span) == [1] * _own(i), i
    assert counted.get("heads_sampled_in_kernel", 0) == N
    # Streamed for an unsampled request: at most the first one's, read before the programs ran.
    assert counted.get("cuda_calls_streamed_unsampled", 0) <= 3
    assert rows == (sum(map(_own, range(N))) + 3, N + 1) and _kept_whole(db) == set(sent)
