"""StoreExporter: what is stored per span and per request, transactions, schema version."""
import json
import sqlite3

import pytest
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_gpu import semconv as sc
from otel_gpu.store.exporter import REQUEST_ATTRIBUTES, StoreExporter
from otel_gpu.store.schema import SCHEMA_VERSION, StoreError, open_reader
from store_helpers import KERNEL, MS, T0, request, window


def test_request_row_and_spans(store, reader):
    spans = request(7, T0, 12 * MS, launches=3, copies=((4096, "h2d"), (1024, "d2h"), (64, "d2d")),
                    gpu_seconds=0.25, cost=0.002, feature="summarize",
                    resource_extra={sc.K8S_NAMESPACE_NAME: "ml", sc.K8S_POD_NAME: "api-0"})
    store.export(spans)
    conn = reader()
    conn.row_factory = sqlite3.Row
    r = dict(conn.execute("SELECT * FROM requests").fetchone())
    assert r == {"ts": T0, "trace_id": f"{7:032x}", "span_id": f"{7001:016x}", "service": "demo",
                 "k8s_namespace": "ml", "k8s_pod": "api-0", "method": "POST", "route": "/infer/{id}",
                 "feature": "summarize", "status_code": 200, "duration_ns": 12 * MS, "launches": 3,
                 "h2d_bytes": 4096, "d2h_bytes": 1024, "d2d_bytes": 64, "other_bytes": 0, "sync_ns": 7,
                 "gpu_seconds": 0.25, "cost": 0.002, "currency": "USD", "ambiguous": 0,
                 "nccl_calls": 0, "nccl_bytes": 0, "graph_kernels": 0, "chunks": 0,
                 "on_cpu": None, "cpu_wait": None, "gpu_sync": None, "blocked": None, "time_shared": 0}
    rows = [dict(x) for x in conn.execute("SELECT * FROM spans ORDER BY start_ns")]
    assert len(rows) == len(spans) == 7
    server, first = rows[0], rows[1]
    assert server["parent_span_id"] == f"{99:016x}"  # remote parent kept
    assert server["kind"] == 1 and server["service"] == "demo" and server["pid"] == 4242
    assert first["parent_span_id"] == server["span_id"] and first["name"] == "cudaLaunchKernel"
    assert json.loads(first["attributes"])[sc.GPU_KERNEL_NAME] == KERNEL
    assert json.loads(first["attributes"])[sc.GPU_GRID] == [4, 1, 1]
    assert {x["group_ts"] for x in rows} == {T0}
    assert store.spans_written == 7 and store.requests_written == 1


def test_missing_cost_is_zero_and_feature_falls_back_to_route(store, reader):
    store.export(request(1, T0, MS, route="/embed"))
    r = reader().execute("SELECT feature, gpu_seconds, cost, currency FROM requests").fetchone()
    assert r == ("/embed", 0.0, 0.0, None)


def test_a_cost_settled_after_the_span_updates_its_request_row(store, reader):
    store.export(request(1, T0, MS, route="/embed"))  # left with otel_gpu.cost.pending
    store.export(request(2, T0, MS, route="/embed"))
    store.settle_cost(1, 1001, 0.5, 0.004, "EUR")
    rows = reader().execute("SELECT trace_id, gpu_seconds, cost, currency FROM requests ORDER BY trace_id").fetchall()
    assert rows == [(f"{1:032x}", 0.5, 0.004, "EUR"), (f"{2:032x}", 0.0, 0.0, None)]


def test_window_stores_spans_without_request_row(store, reader):
    store.export(window(3, T0, launches=2))
    conn = reader()
    assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 3


def test_error_status_kept(store, reader):
    store.export(request(1, T0, MS, status=503))
    assert reader().execute("SELECT status_code FROM spans WHERE kind = 1").fetchone()[0] == 2


def test_failed_write_leaves_nothing_behind(store, db, reader):
    with sqlite3.connect(db) as other:
        other.execute("CREATE TRIGGER boom BEFORE INSERT ON requests BEGIN SELECT RAISE(ABORT, 'boom'); END")
    result = store.export(request(1, T0, MS))  # spans insert first, then the request row fails
    assert result == SpanExportResult.FAILURE and store.write_errors == 1
    assert reader().execute("SELECT count(*) FROM spans").fetchone()[0] == 0


def test_schema_version_and_reopen(db, clock):
    s = StoreExporter(db, now_ns=clock)
    s.export(request(1, T0, MS))
    s.shutdown()
    s.export(request(2, T0, MS))  # after shutdown: ignored, not an exception
    s2 = StoreExporter(db, now_ns=clock)
    s2.export(request(3, T0 + 1, MS))
    s2.shutdown()
    conn = open_reader(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 2
    conn.close()


def test_newer_schema_is_refused(db, clock):
    StoreExporter(db, now_ns=clock).shutdown()
    with sqlite3.connect(db) as c:
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        StoreExporter(db, now_ns=clock)
    with pytest.raises(StoreError, match="newer"):
        open_reader(db)


def test_reader_is_read_only(store, reader):
    store.export(request(1, T0, MS))
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader().execute("DELETE FROM requests")


def test_reader_of_stopped_collector(db, clock):
    """After a clean stop the -wal file is gone; a reader still sees every row."""
    s = StoreExporter(db, now_ns=clock)
    for i in range(5):
        s.export(request(i + 1, T0 + i, MS))
    s.shutdown()
    conn = open_reader(db)
    assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 5 * 5
    conn.close()


def test_bad_limits_rejected(db):
    with pytest.raises(ValueError):
        StoreExporter(db, max_requests=0)


def test_column_map_covers_the_requests_table(store, reader):
    """Every request column is either read from one span attribute (the declared map)
    or derived (ids, resource, feature, duration): none is forgotten or doubled."""
    cols = [r[1] for r in reader().execute("PRAGMA table_info(requests)")]
    derived = {"ts", "trace_id", "span_id", "service", "k8s_namespace", "k8s_pod", "feature", "duration_ns"}
    assert set(REQUEST_ATTRIBUTES) | derived == set(cols) and not set(REQUEST_ATTRIBUTES) & derived


def test_k8s_and_service_come_from_the_resource(store, reader):
    spans = request(1, T0, MS, resource_extra={sc.K8S_POD_NAME: "api-1"})
    spans[0] = ReadableSpan(name=spans[0].name, context=spans[0].context, resource=spans[0].resource,
                            attributes={**spans[0].attributes, sc.K8S_NAMESPACE_NAME: "span-level"},
                            kind=spans[0].kind, start_time=T0, end_time=T0 + MS)
    assert store.export(spans) == SpanExportResult.SUCCESS
    row = reader().execute("SELECT service, k8s_namespace, k8s_pod, status_code, launches FROM requests").fetchone()
    assert row == ("demo", None, "api-1", 200, 2)


def test_window_costs_from_window_spans(store, reader):
    store.export(window(1, T0, gpu_seconds=0.5, cost=0.25))  # outside
    store.export(window(2, T0 + 1, gpu_seconds=0.4, cost=0.2,
                        split=[(0xA, 1, 0.3, "/infer"), (0xB, 2, 0.1, "/embed"), (0xC, 3, 0.0, "/x")]))
    store.export(window(3, T0 + 2))  # no cost stage ran: no row
    conn = reader()
    conn.row_factory = sqlite3.Row
    rows = [dict(r) for r in conn.execute("SELECT * FROM window_costs ORDER BY ts, feature")]
    assert [(r["kind"], r["feature"], r["gpu_seconds"], r["cost"]) for r in rows] == [
        ("outside", None, 0.5, 0.25), ("split", "/embed", 0.1, pytest.approx(0.05)),
        ("split", "/infer", 0.3, pytest.approx(0.15))]  # a zero share writes no row
    assert rows[2]["request_trace_id"] == f"{0xA:032x}" and rows[2]["request_span_id"] == f"{1:016x}"
    assert rows[0]["trace_id"] == f"{1:032x}" and rows[0]["service"] == "demo" and rows[0]["pid"] == 4242
    assert rows[0]["currency"] == "USD" and rows[0]["ts"] == T0


def test_split_that_does_not_match_the_links_keeps_its_seconds(store, reader):
    spans = window(1, T0, gpu_seconds=0.4, cost=0.2, split=[(0xA, 1, 0.3, "/infer"), (0xB, 2, 0.1, "/embed")])
    root = spans[0]
    spans[0] = ReadableSpan(name=root.name, context=root.context, resource=root.resource, kind=root.kind,
                            attributes={**root.attributes, sc.GPU_COST_SPLIT_FEATURES: ["/infer"]},
                            links=root.links, start_time=root.start_time, end_time=root.end_time)
    store.export(spans)
    assert reader().execute("SELECT kind, feature, gpu_seconds FROM window_costs").fetchall() == [
        ("split", "(unknown)", 0.4)]


V1_DDL = """
CREATE TABLE spans (trace_id TEXT NOT NULL, span_id TEXT NOT NULL, parent_span_id TEXT, group_ts INTEGER NOT NULL,
    name TEXT NOT NULL, kind INTEGER NOT NULL, start_ns INTEGER NOT NULL, end_ns INTEGER NOT NULL,
    status_code INTEGER NOT NULL, status_message TEXT, attributes TEXT NOT NULL, service TEXT, pid INTEGER,
    PRIMARY KEY (trace_id, span_id));
CREATE TABLE requests (ts INTEGER NOT NULL, trace_id TEXT NOT NULL, span_id TEXT NOT NULL, service TEXT NOT NULL,
    k8s_namespace TEXT, k8s_pod TEXT, method TEXT, route TEXT, feature TEXT NOT NULL, status_code INTEGER,
    duration_ns INTEGER NOT NULL, launches INTEGER NOT NULL, h2d_bytes INTEGER NOT NULL,
    d2h_bytes INTEGER NOT NULL, d2d_bytes INTEGER NOT NULL, other_bytes INTEGER NOT NULL, sync_ns INTEGER NOT NULL,
    gpu_seconds REAL NOT NULL, cost REAL NOT NULL, currency TEXT, ambiguous INTEGER NOT NULL);
CREATE INDEX spans_group_ts ON spans (group_ts);
CREATE INDEX requests_ts ON requests (ts);
CREATE INDEX requests_latency ON requests (service, feature, duration_ns, ts);
INSERT INTO requests VALUES (1700000000000000000, 'aa', 'bb', 'demo', NULL, NULL, 'GET', '/old', '/old', 200,
    1000000, 1, 0, 0, 0, 0, 0, 0.5, 0.1, 'USD', 3);
PRAGMA user_version = 1;
"""


def _v1_store(db):
    import os
    os.makedirs(os.path.dirname(db), exist_ok=True)
    with sqlite3.connect(db) as c:
        c.executescript(V1_DDL)


def test_v1_store_is_read_as_it_is_and_migrated_by_the_writer(db, clock, reader):
    from otel_gpu.store.report import build_report
    _v1_store(db)
    rep = build_report(reader())  # no window_costs table yet: read without it
    assert [(r["feature"], r["exact_gpu_seconds"], r["split_gpu_seconds"]) for r in rep["rows"]] == [
        ("/old", 0.5, 0.0)]
    s = StoreExporter(db, now_ns=clock)
    s.export(request(1, T0, MS, gpu_seconds=0.25))
    s.export(window(2, T0, gpu_seconds=0.1, cost=0.0))
    s.shutdown()
    conn = reader()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 2  # the old row kept
    rep = build_report(conn)
    assert rep["totals"]["gpu_seconds"] == pytest.approx(0.85)
    assert rep["totals"]["outside_gpu_seconds"] == pytest.approx(0.1)


def test_fractional_ambiguous_share_is_kept(store, reader):
    spans = request(1, T0, MS)
    spans[0] = ReadableSpan(name=spans[0].name, context=spans[0].context, resource=spans[0].resource,
                            attributes={**spans[0].attributes, sc.GPU_CALLS_AMBIGUOUS: 2 / 3},
                            kind=spans[0].kind, start_time=T0, end_time=T0 + MS)
    store.export(spans)
    assert reader().execute("SELECT ambiguous FROM requests").fetchone()[0] == pytest.approx(2 / 3)


def _counts(reader) -> tuple:
    conn = reader()
    return tuple(conn.execute(f"SELECT count(*) FROM {t}").fetchone()[0] for t in ("requests", "spans", "window_costs"))


def test_a_batch_is_written_at_its_end_in_one_transaction(store, reader):
    begins = []
    store._conn.set_trace_callback(lambda sql: begins.append(sql) if sql.startswith("BEGIN") else None)
    store.begin_batch()
    store.export(request(1, T0, MS))
    store.export(window(3, T0, launches=2, gpu_seconds=0.1, cost=0.001))
    store.export(request(2, T0 + MS, MS))
    assert _counts(reader) == (0, 0, 0) and store.requests_written == 0  # kept until the batch ends
    store.end_batch()
    assert _counts(reader) == (2, 2 * len(request(1, T0, MS)) + 3, 1)
    assert len(begins) == 1 and store.requests_written == 2
    store.export(request(4, T0, MS))  # outside a batch: written at once, as before
    assert _counts(reader)[0] == 3 and len(begins) == 2


def test_a_cost_settled_in_the_batch_of_its_request_updates_the_row(store, reader):
    store.begin_batch()
    store.export(request(1, T0, MS, route="/embed"))
    store.settle_cost(1, 1001, 0.5, 0.004, "EUR")  # its row is not written yet: updated after the insert
    store.end_batch()
    store.begin_batch()
    store.settle_cost(1, 1001, 0.75, 0.006, "EUR")  # a later batch's cost for an earlier row
    store.end_batch()
    assert reader().execute("SELECT gpu_seconds, cost, currency FROM requests").fetchall() == [(0.75, 0.006, "EUR")]


def test_shutdown_writes_the_batch_left_open(db, clock, reader):
    s = StoreExporter(db, now_ns=clock)
    s.begin_batch()
    s.export(request(1, T0, MS))
    s.shutdown()
    assert _counts(reader)[0] == 1
