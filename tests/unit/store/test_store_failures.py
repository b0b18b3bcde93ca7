"""The store when it cannot be written: one line naming the path and the real cause at
open, failed writes counted per span (store_write_failed) and logged rate-limited, the
other destinations unaffected; its file modes (0600/0700, or 0640/0750 for a group)."""
from __future__ import annotations

import io
import logging
import os
import sqlite3
import stat

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_gpu import semconv as sc
from otel_gpu.config import Config
from otel_gpu.wiring import build_destinations
from otel_gpu.ratelimit import Stats
from otel_gpu.store.exporter import StoreExporter
from otel_gpu.store.schema import StoreError
from store_helpers import MS, T0, request


def _mode(path) -> int:
    return stat.S_IMODE(os.stat(path).st_mode)


def test_a_file_that_is_not_a_store_is_one_line_with_the_cause(tmp_path):
    db = tmp_path / "x.db"
    db.write_bytes(b"not a database" * 100)
    with pytest.raises(StoreError) as e:
        StoreExporter(str(db))
    assert str(e.value) == f"local store {db} cannot be written: file is not a database"
    assert e.value.__cause__ is None and e.value.__suppress_context__  # nothing masks it


def test_a_path_under_a_file_is_one_line_with_the_cause(tmp_path):
    (tmp_path / "f").write_text("")
    with pytest.raises(StoreError, match=r"cannot be written: (Not a directory|File exists)"):
        StoreExporter(str(tmp_path / "f" / "otel-gpu.db"))


def test_failed_writes_are_counted_per_span_and_logged_rate_limited(tmp_path, caplog):
    db, stats = str(tmp_path / "s.db"), Stats()
    s = StoreExporter(db, stats=stats)
    with sqlite3.connect(db) as other:
        other.execute("CREATE TRIGGER boom BEFORE INSERT ON requests BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
    with caplog.at_level(logging.WARNING):
        for i in range(3):
            assert s.export(request(i + 1, T0, MS)) == SpanExportResult.FAILURE
    spans = len(request(1, T0, MS))
    assert stats.snapshot() == {"store_write_failed": 3 * spans}
    lines = [r.getMessage() for r in caplog.records if "not written" in r.getMessage()]
    assert len(lines) == 1 and db in lines[0] and "disk says no" in lines[0], lines
    with sqlite3.connect(db) as other:
        other.execute("DROP TRIGGER boom")
    assert s.export(request(9, T0, MS)) == SpanExportResult.SUCCESS  # room again: writes resume
    s.shutdown()


def test_private_by_default(tmp_path):
    db = tmp_path / "new" / "otel-gpu.db"
    s = StoreExporter(str(db))
    s.export(request(1, T0, MS))
    assert _mode(db.parent) == 0o700
    files = [p for p in (str(db), f"{db}-wal", f"{db}-shm") if os.path.exists(p)]
    assert len(files) == 3 and {_mode(p) for p in files} == {0o600}
    s.shutdown()


def test_an_older_world_readable_store_is_closed_on_open(tmp_path):
    db = tmp_path / "otel-gpu.db"
    StoreExporter(str(db)).shutdown()
    os.chmod(db, 0o644)
    StoreExporter(str(db)).shutdown()
    assert _mode(db) == 0o600


def test_a_group_may_read(tmp_path):
    gid = os.getgid()  # a group this user may give files to, root or not
    db = tmp_path / "new" / "otel-gpu.db"
    s = StoreExporter(str(db), group=gid)
    s.export(request(1, T0, MS))
    assert (_mode(db.parent), os.stat(db.parent).st_gid) == (0o750, gid)
    for p in (str(db), f"{db}-wal", f"{db}-shm"):
        assert (_mode(p), os.stat(p).st_gid) == (0o640, gid)
    s.shutdown()


def _unusable(tmp_path) -> str:
    db = tmp_path / "x.db"
    db.write_bytes(b"not a database" * 100)
    return str(db)


def test_an_unusable_store_is_left_out_and_otlp_goes_on(tmp_path, caplog):
    stats = Stats()
    with caplog.at_level(logging.ERROR):
        d = build_destinations(Config(store_path=_unusable(tmp_path), otlp_traces=True), stats, out=io.StringIO())
    assert d.names == ["otlp"] and stats.snapshot() == {"store_disabled": 1}
    errors = [r.getMessage() for r in caplog.records if r.levelno >= logging.ERROR]
    assert errors == [f"local store {tmp_path / 'x.db'} cannot be written: file is not a database; "
                      "running on without it: spans still go to otlp"]
    d.shutdown()


def test_an_unusable_store_beside_the_console_is_left_out(tmp_path):
    d = build_destinations(Config(store_path=_unusable(tmp_path), console=True), Stats(), out=io.StringIO())
    assert d.names == ["console"]


def test_an_unusable_store_that_is_the_only_destination_is_fatal(tmp_path):
    with pytest.raises(StoreError, match="file is not a database"):
        build_destinations(Config(store_path=_unusable(tmp_path)), Stats(), out=io.StringIO())


def test_a_failed_batch_is_counted_per_span_and_cost_and_nothing_of_it_stays(tmp_path, caplog):
    db, stats = str(tmp_path / "s.db"), Stats()
    s = StoreExporter(db, stats=stats)
    with sqlite3.connect(db) as other:
        other.execute("CREATE TRIGGER boom BEFORE INSERT ON requests WHEN NEW.trace_id = printf('%032x', 2) "
                      "BEGIN SELECT RAISE(ABORT, 'disk says no'); END")
    s.begin_batch()
    s.export(request(1, T0, MS))
    s.export(request(2, T0, MS))  # its row fails: the whole batch rolls back
    s.settle_cost(1, 1001, 0.5, 0.004, "EUR")
    with caplog.at_level(logging.WARNING):
        s.end_batch()
    spans = len(request(1, T0, MS))
    assert stats.snapshot() == {"store_write_failed": 2 * spans + 1}
    assert any("2 requests" in r.getMessage() and "1 costs" in r.getMessage() and "disk says no" in r.getMessage()
               for r in caplog.records)
    with sqlite3.connect(db) as other:
        assert other.execute("SELECT count(*) FROM spans").fetchone()[0] == 0
    s.shutdown()


def test_a_value_sqlite_cannot_bind_fails_its_write_alone(tmp_path):
    """An integer past int64 raises OverflowError from the binding, not an sqlite3.Error:
    its transaction is rolled back and counted, and the next write goes in (left open, it
    failed every write after it)."""
    stats = Stats()
    s = StoreExporter(str(tmp_path / "s.db"), stats=stats)
    huge = request(1, T0, MS, server_extra={sc.GPU_LAUNCHES: 2**70})
    assert s.export(huge) == SpanExportResult.FAILURE
    assert stats.snapshot() == {"store_write_failed": len(huge)} and s.write_errors == 1
    assert s.export(request(2, T0, MS)) == SpanExportResult.SUCCESS and s.requests_written == 1
    s.shutdown()
