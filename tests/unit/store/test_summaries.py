"""Unsampled requests without an error are summed per route and interval, not kept whole
(#45's decision): the same requests stored as rows or as summaries give the same report,
but for the percentiles, which say when they come from duration buckets; errors and sampled
requests keep their rows; `traces` says what it does not list."""
import random
import sqlite3

import pytest

from otel_gpu import semconv as sc
from otel_gpu.store.exporter import StoreExporter
from otel_gpu.store.report import build_report
from otel_gpu.store.report_text import to_text
from otel_gpu.store.series import cost_series
from otel_gpu.store.summaries import FLUSH_S, INTERVAL_S, DurationBuckets, percentile
from store_helpers import MS, T0, request, run_cli


def test_each_duration_is_in_the_bucket_whose_bounds_hold_it():
    rng = random.Random(1)
    values = [1, 999, 1000, 1001, 1090, 10**9, 3600 * 10**9] + [rng.randrange(1, 10**12) for _ in range(2000)]
    for ns in values + [DurationBuckets.bound(b) + d for b in range(300) for d in (-1, 0, 1)]:
        b = DurationBuckets.of(ns)
        assert ns <= DurationBuckets.bound(b) and (b == 0 or DurationBuckets.bound(b - 1) < ns), ns
    assert all(DurationBuckets.bound(b + 1) <= DurationBuckets.bound(b) * 1.0906 + 1 for b in range(300))


def test_a_percentile_over_rows_and_buckets_is_the_rows_own_value_or_its_buckets_bound():
    """Against the true nearest-rank value of all the durations: the row's own where the
    rank falls in a bucket of rows alone; else the true value's bucket bound (>= it, <= 9 % over)."""
    rng = random.Random(7)
    for _ in range(300):
        kept = sorted(rng.randrange(1, 10**8) for _ in range(rng.randrange(0, 40)))
        summed = [rng.randrange(1, 10**8) for _ in range(rng.randrange(0, 40))]
        buckets: dict = {}
        for v in summed:
            buckets[DurationBuckets.of(v)] = buckets.get(DurationBuckets.of(v), 0) + 1
        every = sorted(kept + summed)
        for rank in range(1, len(every) + 1):
            value, exact = percentile(kept, buckets, rank)
            true = every[rank - 1]
            b = DurationBuckets.of(true)
            if exact:
                assert value == true and b not in buckets
            else:
                assert value == DurationBuckets.bound(b) and b in buckets and true <= value <= true * 1.0906 + 1
        assert percentile(kept, buckets, len(every) + 1) == (None, True)


def _requests(seed: int, n: int = 120) -> list[dict]:
    """n requests over two routes and three intervals, each with its own figures; some 5xx."""
    rng = random.Random(seed)
    out = []
    for i in range(n):
        route = "/gemm" if i % 3 else "/tokenize"
        out.append(dict(trace_id=i + 1, start=T0 + (i % 30) * 10**9 + i, duration=rng.randrange(1, 400) * MS,
                        route=route, launches=rng.randrange(0, 9), copies=((rng.randrange(1, 9000), "h2d"),),
                        gpu_seconds=rng.random() / 100, cost=rng.random() / 1e6, status=503 if i % 17 == 0 else 200,
                        server_extra={sc.GPU_TIME_ON_CPU: 0.001 * (i % 5), sc.GPU_TIME_CPU_WAIT: 0.0,
                                      sc.GPU_TIME_GPU_SYNC: 0.002, sc.GPU_TIME_BLOCKED: 0.0,
                                      sc.GPU_RESPONSE_CHUNKS: 3} if i % 2 else None))
    return out


def _store(path: str, clock, requests: list[dict], sampled) -> None:
    s = StoreExporter(path, now_ns=clock)
    for r in requests:
        s.export(request(**r, sampled=sampled(r)))
    s.shutdown()


def _rounded(x):
    if isinstance(x, float):
        return round(x, 9)
    if isinstance(x, dict):
        return {k: _rounded(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_rounded(v) for v in x]
    return x


def test_summarised_requests_give_the_report_their_rows_would(tmp_path, clock):
    """The same 120 requests, all sampled / one in five sampled: every figure of every row
    and of the totals, the time split and the cost per chunk alike; the percentiles of the
    summarised rows from buckets, said so, within 9 %."""
    reqs = _requests(3)
    whole, mixed = str(tmp_path / "whole.db"), str(tmp_path / "mixed.db")
    _store(whole, clock, reqs, lambda r: True)
    _store(mixed, clock, reqs, lambda r: r["trace_id"] % 5 == 0)
    a, b = (build_report(sqlite3.connect(p)) for p in (whole, mixed))
    errors = sum(r["status"] >= 500 for r in reqs)
    kept = sqlite3.connect(mixed).execute("SELECT COUNT(*) FROM requests").fetchone()[0]
    assert kept == len([r for r in reqs if r["trace_id"] % 5 == 0 or r["status"] >= 500]) and kept > errors
    assert b["totals"]["summarised"] == len(reqs) - kept and a["totals"]["summarised"] == 0
    pct = ("p50_ms", "p95_ms", "percentiles", "summarised", "share")
    for ra, rb in zip(a["rows"], b["rows"]):
        assert _rounded({k: v for k, v in ra.items() if k not in pct}) == \
            _rounded({k: v for k, v in rb.items() if k not in pct})
        assert ra["percentiles"] == "exact" and rb["percentiles"] == "buckets"
        for p in ("p50_ms", "p95_ms"):
            assert ra[p] <= rb[p] <= ra[p] * 1.0906 + 1e-6
    assert _rounded(a["time_split"]) == _rounded(b["time_split"]) and a["time_split"]
    assert _rounded(a["per_chunk"]) == _rounded(b["per_chunk"]) and a["per_chunk"]
    assert a["totals"]["requests"] == b["totals"]["requests"] == len(reqs)
    series_a, series_b = (cost_series(sqlite3.connect(p)) for p in (whole, mixed))
    for key, s in series_a["series"].items():  # summed over time, each route's seconds alike
        assert round(sum(s["gpu_seconds"]), 9) == round(sum(series_b["series"][key]["gpu_seconds"]), 9)
    text = to_text(b)
    assert "~" in text and f"duration buckets of the {len(reqs) - kept} requests summarised" in text


def test_an_error_and_a_sampled_request_keep_their_rows_the_others_only_sums(store, reader, clock):
    clock.now = T0 + 10 * MS  # as they end (a summary's interval is let go two intervals on)
    store.export(request(1, T0, 5 * MS, sampled=False))
    store.export(request(2, T0 + 1, 6 * MS, sampled=False, status=500))
    store.export(request(3, T0 + 2, 7 * MS))
    store.export(request(4, T0 + 3, 8 * MS, sampled=False)[:1])  # its SERVER span alone, as the builder sends it
    store.shutdown()
    conn = reader()
    assert sorted(r[0] for r in conn.execute("SELECT trace_id FROM requests")) == [f"{2:032x}", f"{3:032x}"]
    assert {r[0] for r in conn.execute("SELECT DISTINCT trace_id FROM spans")} == {f"{2:032x}", f"{3:032x}"}
    (n, launches, durations), = conn.execute("SELECT requests, launches, duration_ns FROM request_summaries")
    assert (n, launches, durations) == (2, 4, 13 * MS) and store.requests_summed == 2


def test_summaries_are_written_each_flush_and_one_interval_is_one_row(store, reader, clock):
    clock.now = T0
    store.export(request(1, T0, 5 * MS, sampled=False))  # the first flush is due at once
    store.export(request(2, T0 + 1, 5 * MS, sampled=False))
    conn = reader()
    assert conn.execute("SELECT requests FROM request_summaries").fetchall() == [(1,)]
    clock.now += int(FLUSH_S * 1e9)
    store.tick()  # the pipeline's Tick: written without a new request
    assert conn.execute("SELECT requests FROM request_summaries").fetchall() == [(2,)]
    store.export(request(3, T0 + INTERVAL_S * 10**9, 5 * MS, sampled=False))  # the next interval
    clock.now += int(FLUSH_S * 1e9)
    store.tick()
    assert conn.execute("SELECT ts, requests FROM request_summaries ORDER BY ts").fetchall() == \
        [(T0 - T0 % (INTERVAL_S * 10**9), 2), (T0 - T0 % (INTERVAL_S * 10**9) + INTERVAL_S * 10**9, 1)]


def test_a_cost_settled_after_its_request_was_summarised_adds_to_its_summary(store, reader, clock):
    clock.now = T0 + 10 * MS
    spans = request(1, T0, 5 * MS, sampled=False, server_extra={sc.GPU_COST_PENDING: True})
    store.export(spans[:1])
    store.export(request(2, T0 + 1, 5 * MS, sampled=False, gpu_seconds=0.5, cost=2.0))
    store.settle_cost(1, 1 * 1000 + 1, 0.25, 1.0, "USD")
    store.settle_cost(1, 1 * 1000 + 1, 9.0, 9.0, "USD")  # once only: no longer pending
    store.shutdown()
    (seconds, cost, currency), = reader().execute("SELECT gpu_seconds, cost, currency FROM request_summaries")
    assert (seconds, cost, currency) == (0.75, 3.0, "USD")


def test_summaries_go_with_the_stores_retention(db, clock, reader):
    clock.now = T0
    s = StoreExporter(db, now_ns=clock, retention_s=60)
    s.export(request(1, T0, 5 * MS, sampled=False))
    clock.now = T0 + 120 * 10**9
    s.export(request(2, clock.now, 5 * MS, sampled=False))
    s.shutdown()
    assert reader().execute("SELECT ts FROM request_summaries").fetchall() == [(clock.now - clock.now % 10**10,)]


def test_traces_says_what_it_does_not_list(store, db):
    store.export(request(1, T0, 5 * MS))
    for i in range(2, 6):
        store.export(request(i, T0 + i, (100 + i) * MS, sampled=False))
    store.shutdown()
    code, out = run_cli("traces", "--db", db, "--slowest", "3")
    assert code == 0 and "4 more requests were summarised" in out
    bound = DurationBuckets.bound(DurationBuckets.of(105 * MS)) / 1e6
    assert f"at most {bound:.1f} ms" in out and 105 <= bound <= 105 * 1.0906
    code, out = run_cli("traces", "--db", db, "--route", "/other")
    assert code == 0 and "summarised" not in out


@pytest.mark.parametrize("kept", ["console", None])
def test_the_export_stage_builds_an_unsampled_request_as_far_as_a_destination_keeps_it(tmp_path, kept):
    """With the store (and OTLP), an unsampled request's SERVER span alone; with the console
    beside them, every span; an error, every span in any case."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_gpu.clock import BpfClock
    from otel_gpu.export.console import ConsoleTreeExporter
    from otel_gpu.export.destinations import Destinations, QueuedExporter
    from otel_gpu.export.spans import SpanBuilder
    from otel_gpu.export.stage import ExportStage
    from otel_gpu.ratelimit import Stats
    from tests.unit.export.test_spans import request as pipeline_request

    import io
    stats = Stats()
    store = StoreExporter(str(tmp_path / "s.db"))
    q = QueuedExporter(InMemorySpanExporter(), stats, schedule_delay_ms=10)
    dests = Destinations(([("console", ConsoleTreeExporter(io.StringIO()))] if kept else [])
                         + [("store", store), ("otlp", q)], stats)
    ok, failed = pipeline_request(), pipeline_request()
    ok.sampled = failed.sampled = False
    failed.status = 502
    stage = ExportStage(SpanBuilder(BpfClock(), stats=stats), dests)
    stage.process([ok])
    whole = len(SpanBuilder(BpfClock()).build(ok))
    assert whole > 1 and dests.spans_out == (whole if kept else 1)
    stage.process([failed])
    assert dests.spans_out == (whole if kept else 1) + whole
    store.shutdown()
    q.shutdown()
    conn = sqlite3.connect(str(tmp_path / "s.db"))
    assert conn.execute("SELECT status_code FROM requests").fetchall() == [(502,)]
    assert conn.execute("SELECT requests FROM request_summaries").fetchall() == [(1,)]
    assert stats.snapshot()["traces_unsampled"] == 2
