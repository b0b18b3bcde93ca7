"""`otel-gpu report`: the figures match the spans written, sorting, filters, output."""
import json
import math

import pytest

from otel_gpu.store.report import REPORT_FIELDS, ROW_FIELDS, TOTAL_FIELDS, build_report
from otel_gpu.store.report_text import to_text
from store_helpers import MS, T0, request, run_cli

S = 10**9


def nearest_rank(values, p):
    v = sorted(values)
    return v[max(1, math.ceil(p / 100 * len(v))) - 1]


# route -> [(duration ms, launches, h2d bytes, gpu seconds, cost)]
WORK = {
    "/infer": [(d, 3, 4096, 0.02, 0.0004) for d in (5, 7, 9, 11, 13, 40, 41, 90, 100, 300)],
    "/embed": [(d, 1, 512, 0.01, 0.0001) for d in (2, 3, 4)],
    "/health": [(1, 0, 0, 0.0, 0.0)] * 4,
}


@pytest.fixture
def filled(store):
    tid = 1
    for route, reqs in WORK.items():
        for dur, launches, h2d, gpu_s, cost in reqs:
            store.export(request(tid, T0 + tid * S, dur * MS, route=route, launches=launches,
                               copies=[(h2d, "h2d"), (100, "d2h")] if h2d else [],
                               gpu_seconds=gpu_s, cost=cost))
            tid += 1
    store.export(request(tid, T0 + tid * S, 8 * MS, service="other", route="/infer", launches=5,
                       gpu_seconds=0.5, cost=0.01))
    return store


def test_figures_match_the_spans(filled, reader):
    rep = build_report(reader(), service="demo")
    assert [r["feature"] for r in rep["rows"]] == ["/infer", "/embed", "/health"]  # by cost, descending
    total_cost = sum(c for reqs in WORK.values() for *_, c in reqs)
    for row in rep["rows"]:
        reqs = WORK[row["feature"]]
        durs = [d for d, *_ in reqs]
        assert row["service"] == "demo"
        assert row["requests"] == len(reqs)
        assert row["p50_ms"] == nearest_rank(durs, 50) and row["p95_ms"] == nearest_rank(durs, 95)
        assert row["launches_per_request"] == pytest.approx(sum(r[1] for r in reqs) / len(reqs))
        assert row["copy_bytes"] == sum(r[2] + (100 if r[2] else 0) for r in reqs)
        assert row["gpu_seconds"] == pytest.approx(sum(r[3] for r in reqs))
        assert row["cost"] == pytest.approx(sum(r[4] for r in reqs))
        assert row["share"] == pytest.approx(row["cost"] / total_cost)
    assert rep["rows"][0]["p95_ms"] == 300 and rep["rows"][0]["p50_ms"] == 13
    assert sum(r["share"] for r in rep["rows"]) == pytest.approx(1.0)
    assert rep["totals"]["requests"] == 17 and rep["totals"]["share"] == 1.0
    assert rep["totals"]["p95_ms"] == nearest_rank([d for reqs in WORK.values() for d, *_ in reqs], 95)
    assert rep["currency"] == "USD" and rep["share_of"] == "cost" and rep["service"] == "demo"


def test_all_services_sorted_by_cost(filled, reader):
    rep = build_report(reader())
    assert [(r["service"], r["feature"]) for r in rep["rows"]][:2] == [("other", "/infer"), ("demo", "/infer")]
    costs = [r["cost"] for r in rep["rows"]]
    assert costs == sorted(costs, reverse=True)
    assert sum(r["share"] for r in rep["rows"]) == pytest.approx(1.0)


def test_since_filter(filled, reader):
    # Requests are 1 s apart from T0 + 1 s; since T0 + 11 s keeps ids 11..18.
    rep = build_report(reader(), since_ns=T0 + 11 * S)
    assert rep["totals"]["requests"] == 8
    assert rep["since"] == "2023-11-14T22:13:31Z"
    # Percentiles see only the requests since: /infer ids 6..10 took 40, 41, 90, 100, 300 ms.
    infer = next(r for r in build_report(reader(), since_ns=T0 + 6 * S, service="demo")["rows"]
                 if r["feature"] == "/infer")
    assert (infer["requests"], infer["p50_ms"], infer["p95_ms"]) == (5, 90, 300)


def test_share_falls_back_to_gpu_seconds_then_requests(store, reader):
    store.export(request(1, T0, MS, route="/a", gpu_seconds=3.0))
    store.export(request(2, T0, MS, route="/b", gpu_seconds=1.0))
    store.export(request(3, T0, MS, route="/c", service="cpu"))
    rep = build_report(reader())
    assert rep["share_of"] == "gpu_seconds" and rep["currency"] is None
    assert [r["share"] for r in rep["rows"]] == [0.75, 0.25, 0.0]
    assert all(r["p50_ms"] == r["p95_ms"] == 1.0 for r in rep["rows"])  # one request each
    rep = build_report(reader(), service="cpu")
    assert rep["share_of"] == "requests" and rep["rows"][0]["share"] == 1.0


def test_mixed_currencies_are_flagged(store, reader):
    store.export(request(1, T0, MS, cost=1.0, currency="USD"))
    store.export(request(2, T0, MS, cost=1.0, currency="EUR"))
    assert build_report(reader())["currency"] == "mixed"


def test_json_has_exactly_the_documented_fields(filled, db):
    code, out = run_cli("report", "--db", db, "--format", "json", "--service", "demo", "--since", "2023-11-14")
    assert code == 0
    rep = json.loads(out)
    assert tuple(rep) == REPORT_FIELDS
    assert all(tuple(r) == ROW_FIELDS for r in rep["rows"]) and len(rep["rows"]) == 3
    assert tuple(rep["totals"]) == TOTAL_FIELDS
    assert rep["rows"][0]["requests"] == 10 and rep["service"] == "demo"
    # Every documented field is named in the module docstring (the README copies it).
    import otel_gpu.store.report as mod
    for field in set(REPORT_FIELDS) | set(ROW_FIELDS) | set(TOTAL_FIELDS):
        assert f"\n    {field}" in mod.__doc__ or f" {field}" in mod.__doc__, field


def test_json_of_empty_store(store, db):
    code, out = run_cli("report", "--db", db, "--format", "json")
    rep = json.loads(out)
    assert code == 0 and rep["rows"] == [] and rep["totals"]["requests"] == 0
    assert rep["totals"]["p50_ms"] is None and rep["totals"]["share"] == 0.0


def test_text_table_fits_80_columns(filled, store, db):
    long_route = "/v1/models/{model}/versions/{version}/infer-with-a-long-suffix"
    store.export(request(500, T0 + 500 * S, MS, route=long_route, service="a-rather-long-service-name",
                       cost=0.5, gpu_seconds=9.0))
    code, out = run_cli("report", "--db", db)
    lines = out.splitlines()
    assert code == 0 and all(len(line) <= 80 for line in lines), max(map(len, lines))
    header = next(i for i, line in enumerate(lines) if line.startswith("SERVICE"))
    body = lines[header + 1:header + 6]
    svc, feature = body[0].split()[:2]  # both truncated in the middle, keeping both ends
    assert svc.startswith("a-r") and svc.endswith("name") and "…" in svc
    assert feature.startswith("/v1/") and feature.endswith("-suffix") and "…" in feature
    assert body[0].endswith("%")
    assert body[1].startswith("other") and "/infer" in body[1]
    assert "COST USD" in lines[header] and any(line.startswith("TOTAL") or " TOTAL " in line for line in lines)


def test_text_columns_align(filled, reader):
    lines = to_text(build_report(reader(), service="demo"), width=80).splitlines()
    table = [line for line in lines if "%" in line or "SHARE" in line]
    assert len({len(line) for line in table}) == 1  # right-aligned numbers end together
    assert "service demo" in lines[0]


def test_split_and_outside_time(store, reader, db):
    from store_helpers import window
    store.export(request(1, T0 + S, MS, route="/infer", gpu_seconds=0.2, cost=0.02))
    store.export(window(2, T0 + 2 * S, gpu_seconds=0.3, cost=0.03,
                        split=[(1, 1001, 0.1, "/infer"), (9, 9001, 0.2, "/only-split")]))
    store.export(window(3, T0 + 3 * S, gpu_seconds=0.4, cost=0.04))               # outside
    store.export(window(4, T0 + 4 * S, service="other", gpu_seconds=1.0, cost=0.1))  # another service
    rep = build_report(reader(), service="demo")
    rows = {r["feature"]: r for r in rep["rows"]}
    assert [r["feature"] for r in rep["rows"]] == [None, "/infer", "/only-split"]  # by cost
    assert (rows["/infer"]["exact_gpu_seconds"], rows["/infer"]["split_gpu_seconds"]) == (0.2, 0.1)
    assert rows["/infer"]["gpu_seconds"] == pytest.approx(0.3) and rows["/infer"]["cost"] == pytest.approx(0.03)
    assert rows["/only-split"]["requests"] == 0 and rows["/only-split"]["p50_ms"] is None
    assert rows[None]["outside_gpu_seconds"] == 0.4 and rows[None]["gpu_seconds"] == 0.4
    assert rep["totals"]["gpu_seconds"] == pytest.approx(0.9)
    assert rep["totals"]["split_gpu_seconds"] == pytest.approx(0.3)
    assert sum(r["share"] for r in rep["rows"]) == pytest.approx(1.0)
    assert build_report(reader(), since_ns=T0 + 3 * S, service="demo")["totals"]["gpu_seconds"] == 0.4
    code, out = run_cli("report", "--db", db, "--service", "demo")
    lines = out.splitlines()
    header = next(line for line in lines if line.startswith("FEATURE"))
    assert "SPLIT s" in header and "GPU s" in header
    outside = next(line for line in lines if line.startswith("(outside)"))
    assert outside.split()[1:4] == ["0", "-", "-"]  # no requests, no latency


def test_raw_escape_sequences_in_an_older_store_are_neutralised(store, db):
    """Service, feature and currency read back from a store that holds terminal escapes
    are shown replaced (U+FFFD) in the text table and the JSON."""
    store.export(request(1, T0, 5 * MS, service="svc\x1b]0;pwned\x07", route="/a\x1b[2J",
                         feature="f\x9b31m", gpu_seconds=0.5, cost=0.1, currency="U\x1b[5mSD"))
    store.force_flush()
    for fmt in ("text", "json"):
        code, out = run_cli("report", "--db", db, "--format", fmt)
        shown = json.loads(out) if fmt == "json" else out
        text = json.dumps(shown, ensure_ascii=False) if fmt == "json" else shown
        assert code == 0
        assert not [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f)], repr(text)
        assert "svc\ufffd]0;pwned\ufffd" in text and "f\ufffd31m" in text and "U\ufffd[5mSD" in text


def test_clamped_byte_counts_do_not_overflow_the_sums(store, reader):
    """Spans clamp absurd counts to 2^63-1 (export/spans.py); two such requests must
    not make SQLite's integer SUM raise in `report`."""
    huge = 2**63 - 1
    for tid in (1, 2):
        store.export(request(tid, T0 + tid * S, 5 * MS, launches=1, copies=[(huge, "h2d")]))
    (row,) = build_report(reader())["rows"]
    assert row["requests"] == 2 and row["copy_bytes"] >= 2 * huge - 2**12
