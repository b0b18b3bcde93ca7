"""Bounded retention: request count and age, with spans going along with their request."""
from otel_gpu.store.exporter import StoreExporter
from store_helpers import MS, T0, request, window

S = 10**9


def _counts(conn):
    reqs = conn.execute("SELECT count(*) FROM requests").fetchone()[0]
    spans = conn.execute("SELECT count(*) FROM spans").fetchone()[0]
    # Orphans either way: a request without its server span, or spans of a trace
    # whose request row was deleted.
    missing = conn.execute("SELECT count(*) FROM requests r WHERE NOT EXISTS "
                           "(SELECT 1 FROM spans s WHERE s.trace_id = r.trace_id AND s.span_id = r.span_id)"
                           ).fetchone()[0]
    orphans = conn.execute("SELECT count(*) FROM spans s WHERE s.kind = 1 AND NOT EXISTS "
                           "(SELECT 1 FROM requests r WHERE r.trace_id = s.trace_id)").fetchone()[0]
    return reqs, spans, missing, orphans


def test_count_bound_holds_after_every_write(db, clock, reader):
    s = StoreExporter(db, max_requests=50, now_ns=clock)
    conn = reader()
    for i in range(1, 301):
        s.export(request(i, T0 + i * MS, MS))
        reqs, spans, missing, orphans = _counts(conn)
        assert reqs <= 50, f"after write {i}: {reqs} requests"
        assert spans == reqs * 5 and missing == 0 and orphans == 0
    # The newest are the ones kept.
    kept = [r[0] for r in conn.execute("SELECT ts FROM requests ORDER BY ts")]
    assert kept[-1] == T0 + 300 * MS and kept == sorted(set(kept))
    assert kept[0] >= T0 + 250 * MS
    assert s.rows_pruned > 0
    s.shutdown()


def test_count_pruning_is_chunked_not_per_row(db, clock, reader):
    """Past the bound it deletes down to 10% below, so most writes delete nothing."""
    s = StoreExporter(db, max_requests=100, now_ns=clock)
    conn = reader()
    deletes = 0
    for i in range(1, 401):
        before = s.rows_pruned
        s.export(request(i, T0 + i * MS, MS))
        deletes += s.rows_pruned != before
    assert 0 < deletes <= 40
    assert 90 <= conn.execute("SELECT count(*) FROM requests").fetchone()[0] <= 100
    s.shutdown()


def test_age_bound(db, clock, reader):
    clock.now = T0 + 100 * S
    s = StoreExporter(db, retention_s=3600, prune_interval_s=5, now_ns=clock)
    s.export(request(1, T0, MS))                 # written when it is 100 s old
    s.export(window(2, T0, gpu_seconds=0.1))     # a window of the same age
    s.export(request(3, T0 + 1800 * S, MS))      # written "in the future" of the clock
    conn = reader()
    assert _counts(conn)[:2] == (2, 5 + 2 + 5)
    assert conn.execute("SELECT count(*) FROM window_costs").fetchone()[0] == 1
    clock.now = T0 + 3601 * S                   # the first two pass 1 h; the third is 30 min old
    s.export(request(4, T0 + 3600 * S, MS))
    assert _counts(conn) == (2, 10, 0, 0)
    assert conn.execute("SELECT count(*) FROM window_costs").fetchone()[0] == 0  # went with its window
    assert sorted(r[0] for r in conn.execute("SELECT trace_id FROM requests")) == [f"{3:032x}", f"{4:032x}"]
    s.shutdown()


def test_age_pruning_waits_for_the_interval(db, clock, reader):
    """Age is checked every prune_interval_s, not on every write."""
    clock.now = T0
    s = StoreExporter(db, retention_s=60, prune_interval_s=120, now_ns=clock)
    s.export(request(1, T0, MS))
    clock.now = T0 + 61 * S                     # too old now, but the last check was at T0
    s.export(request(2, T0 + 61 * S, MS))
    conn = reader()
    assert _counts(conn)[0] == 2
    clock.now = T0 + 121 * S
    s.export(request(3, T0 + 121 * S, MS))
    assert _counts(conn)[0] == 2 and conn.execute(
        f"SELECT count(*) FROM requests WHERE trace_id = '{1:032x}'").fetchone()[0] == 0
    s.shutdown()


def test_reopening_with_a_smaller_bound_prunes_at_start(db, clock, reader):
    s = StoreExporter(db, max_requests=1000, now_ns=clock)
    for i in range(1, 101):
        s.export(request(i, T0 + i * MS, MS))
    s.shutdown()
    s = StoreExporter(db, max_requests=20, now_ns=clock)
    assert _counts(reader())[0] <= 20
    s.shutdown()


def test_windows_older_than_the_oldest_request_go_with_count_pruning(db, clock, reader):
    s = StoreExporter(db, max_requests=10, now_ns=clock)
    s.export(window(999, T0))
    for i in range(1, 31):
        s.export(request(i, T0 + i * MS, MS))
    conn = reader()
    assert conn.execute(f"SELECT count(*) FROM spans WHERE trace_id = '{999:032x}'").fetchone()[0] == 0
    s.shutdown()
