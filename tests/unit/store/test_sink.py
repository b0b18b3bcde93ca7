"""StoreSink: what is stored per span and per request, transactions, schema version."""
import json
import sqlite3

import pytest

from otel_gpu import semconv as sc
from otel_gpu.store.schema import SCHEMA_VERSION, StoreError, open_reader
from otel_gpu.store.sink import StoreSink
from store_helpers import KERNEL, MS, T0, request, window


def test_request_row_and_spans(sink, reader):
    spans = request(7, T0, 12 * MS, launches=3, copies=((4096, "h2d"), (1024, "d2h"), (64, "d2d")),
                    gpu_seconds=0.25, cost=0.002, feature="summarize",
                    resource_extra={sc.K8S_NAMESPACE_NAME: "ml", sc.K8S_POD_NAME: "api-0"})
    sink.write(spans)
    conn = reader()
    conn.row_factory = sqlite3.Row
    r = dict(conn.execute("SELECT * FROM requests").fetchone())
    assert r == {"ts": T0, "trace_id": f"{7:032x}", "span_id": f"{7001:016x}", "service": "demo",
                 "k8s_namespace": "ml", "k8s_pod": "api-0", "method": "POST", "route": "/infer/{id}",
                 "feature": "summarize", "status_code": 200, "duration_ns": 12 * MS, "launches": 3,
                 "h2d_bytes": 4096, "d2h_bytes": 1024, "d2d_bytes": 64, "other_bytes": 0, "sync_ns": 7,
                 "gpu_seconds": 0.25, "cost": 0.002, "currency": "USD", "ambiguous": 0}
    rows = [dict(x) for x in conn.execute("SELECT * FROM spans ORDER BY start_ns")]
    assert len(rows) == len(spans) == 7
    server, first = rows[0], rows[1]
    assert server["parent_span_id"] == f"{99:016x}"  # remote parent kept
    assert server["kind"] == 1 and server["service"] == "demo" and server["pid"] == 4242
    assert first["parent_span_id"] == server["span_id"] and first["name"] == "cudaLaunchKernel"
    assert json.loads(first["attributes"])[sc.GPU_KERNEL_NAME] == KERNEL
    assert json.loads(first["attributes"])[sc.GPU_GRID] == [4, 1, 1]
    assert {x["group_ts"] for x in rows} == {T0}
    assert sink.spans_written == 7 and sink.requests_written == 1


def test_missing_cost_is_zero_and_feature_falls_back_to_route(sink, reader):
    sink.write(request(1, T0, MS, route="/embed"))
    r = reader().execute("SELECT feature, gpu_seconds, cost, currency FROM requests").fetchone()
    assert r == ("/embed", 0.0, 0.0, None)


def test_window_stores_spans_without_request_row(sink, reader):
    sink.write(window(3, T0, launches=2))
    conn = reader()
    assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 0
    assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 3


def test_error_status_kept(sink, reader):
    sink.write(request(1, T0, MS, status=503))
    assert reader().execute("SELECT status_code FROM spans WHERE kind = 1").fetchone()[0] == 2


def test_failed_write_leaves_nothing_behind(sink, db, reader):
    with sqlite3.connect(db) as other:
        other.execute("CREATE TRIGGER boom BEFORE INSERT ON requests BEGIN SELECT RAISE(ABORT, 'boom'); END")
    sink.write(request(1, T0, MS))  # spans insert first, then the request row fails
    assert sink.write_errors == 1
    assert reader().execute("SELECT count(*) FROM spans").fetchone()[0] == 0


def test_schema_version_and_reopen(db, clock):
    s = StoreSink(db, now_ns=clock)
    s.write(request(1, T0, MS))
    s.shutdown()
    s.write(request(2, T0, MS))  # after shutdown: ignored, not an exception
    s2 = StoreSink(db, now_ns=clock)
    s2.write(request(3, T0 + 1, MS))
    s2.shutdown()
    conn = open_reader(db)
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION
    assert conn.execute("PRAGMA journal_mode").fetchone()[0] == "wal"
    assert conn.execute("SELECT count(*) FROM requests").fetchone()[0] == 2
    conn.close()


def test_newer_schema_is_refused(db, clock):
    StoreSink(db, now_ns=clock).shutdown()
    with sqlite3.connect(db) as c:
        c.execute(f"PRAGMA user_version = {SCHEMA_VERSION + 1}")
    with pytest.raises(StoreError, match="newer"):
        StoreSink(db, now_ns=clock)
    with pytest.raises(StoreError, match="newer"):
        open_reader(db)


def test_reader_is_read_only(sink, reader):
    sink.write(request(1, T0, MS))
    with pytest.raises(sqlite3.OperationalError, match="readonly"):
        reader().execute("DELETE FROM requests")


def test_reader_of_stopped_collector(db, clock):
    """After a clean stop the -wal file is gone; a reader still sees every row."""
    s = StoreSink(db, now_ns=clock)
    for i in range(5):
        s.write(request(i + 1, T0 + i, MS))
    s.shutdown()
    conn = open_reader(db)
    assert conn.execute("SELECT count(*) FROM spans").fetchone()[0] == 5 * 5
    conn.close()


def test_bad_limits_rejected(db):
    with pytest.raises(ValueError):
        StoreSink(db, max_requests=0)
