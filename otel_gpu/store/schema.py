"""The store's tables, its version (PRAGMA user_version) and how to open it.

One collector writes; any number of `report`/`traces` processes read. WAL mode lets
readers see the last committed write() while the next one is being written."""
from __future__ import annotations

import os
import sqlite3
from pathlib import Path
from typing import Optional

SCHEMA_VERSION = 6
# v1 -> v2: the window_costs table (the DDL creates it), requests.ambiguous became a
# fractional share. v1 stores keep its INTEGER declaration: SQLite stores a value that
# is not a whole number as REAL whatever the column says, so no rewrite is needed.
# v2 -> v3: requests' NCCL and graph-kernel counts (ADDED_COLUMNS: ALTER TABLE, rows
# already kept read 0, which they had none of: both came with v3's collector).
# v3 -> v4: requests' response chunks (otel_gpu.response.chunks), for cost per streamed token.
# v4 -> v5: where each request's time went (otel_gpu.time.*, seconds; NULL: not split).
# v5 -> v6: request_summaries (the DDL creates it): unsampled requests without an error,
# summed per route and interval (store/summaries.py) instead of a row and spans each.

# group_ts: start of the root span of the write() batch a span arrived in. A request
# row and its spans share it, so retention deletes both with one comparison each.
_DDL = """
CREATE TABLE IF NOT EXISTS spans (
    trace_id TEXT NOT NULL,          -- 32 lowercase hex digits
    span_id TEXT NOT NULL,           -- 16 lowercase hex digits
    parent_span_id TEXT,
    group_ts INTEGER NOT NULL,
    name TEXT NOT NULL,
    kind INTEGER NOT NULL,           -- opentelemetry.trace.SpanKind value
    start_ns INTEGER NOT NULL,
    end_ns INTEGER NOT NULL,
    status_code INTEGER NOT NULL,    -- opentelemetry.trace.StatusCode value
    status_message TEXT,
    attributes TEXT NOT NULL,        -- JSON object
    service TEXT,
    pid INTEGER,
    PRIMARY KEY (trace_id, span_id)
);
CREATE INDEX IF NOT EXISTS spans_group_ts ON spans (group_ts);
CREATE TABLE IF NOT EXISTS requests (
    ts INTEGER NOT NULL,             -- server span start, epoch ns
    trace_id TEXT NOT NULL,
    span_id TEXT NOT NULL,
    service TEXT NOT NULL,
    k8s_namespace TEXT,
    k8s_pod TEXT,
    method TEXT,
    route TEXT,
    feature TEXT NOT NULL,
    status_code INTEGER,
    duration_ns INTEGER NOT NULL,
    launches INTEGER NOT NULL,
    h2d_bytes INTEGER NOT NULL,
    d2h_bytes INTEGER NOT NULL,
    d2d_bytes INTEGER NOT NULL,
    other_bytes INTEGER NOT NULL,
    sync_ns INTEGER NOT NULL,
    gpu_seconds REAL NOT NULL,
    cost REAL NOT NULL,
    currency TEXT,
    ambiguous REAL NOT NULL,         -- otel_gpu.calls.ambiguous: share of ambiguous calls
    nccl_calls INTEGER NOT NULL DEFAULT 0,     -- gpu.nccl.calls
    nccl_bytes INTEGER NOT NULL DEFAULT 0,     -- gpu.nccl.total_bytes
    graph_kernels INTEGER NOT NULL DEFAULT 0,  -- gpu.graph.kernel_launches
    chunks INTEGER NOT NULL DEFAULT 0,         -- otel_gpu.response.chunks
    on_cpu REAL,                     -- otel_gpu.time.*: seconds, NULL when not split
    cpu_wait REAL,
    gpu_sync REAL,
    blocked REAL,
    time_shared INTEGER NOT NULL DEFAULT 0     -- otel_gpu.time.shared
);
CREATE INDEX IF NOT EXISTS requests_ts ON requests (ts);
-- Covering index for report's percentiles: each group's durations in order, ts to filter.
CREATE INDEX IF NOT EXISTS requests_latency ON requests (service, feature, duration_ns, ts);
-- A cost settled after its request's row was written updates the row (exporter.settle_cost).
CREATE INDEX IF NOT EXISTS requests_span ON requests (span_id);
-- GPU time of ambiguous/shared/outside windows (their spans' cost attributes): one row per
-- candidate's share of an ambiguous or shared window (kind 'split', the candidate's feature), one
-- per outside window (kind 'outside', feature NULL).
CREATE TABLE IF NOT EXISTS window_costs (
    ts INTEGER NOT NULL,             -- window span start, epoch ns
    trace_id TEXT NOT NULL,          -- the window span
    span_id TEXT NOT NULL,
    service TEXT NOT NULL,
    pid INTEGER,
    kind TEXT NOT NULL,              -- 'split' or 'outside'
    feature TEXT,
    request_trace_id TEXT,           -- the candidate request (split rows)
    request_span_id TEXT,
    gpu_seconds REAL NOT NULL,
    cost REAL NOT NULL,
    currency TEXT
);
CREATE INDEX IF NOT EXISTS window_costs_ts ON window_costs (ts);
-- Requests summed, not kept whole (store/summaries.py): one row per route (the key columns)
-- and INTERVAL_S of request starts, rewritten while the interval is open. Sums of the
-- requests columns of the same name, the time parts over split_requests only.
CREATE TABLE IF NOT EXISTS request_summaries (
    id INTEGER PRIMARY KEY AUTOINCREMENT,  -- never reused: a summary is rewritten by it
    ts INTEGER NOT NULL,             -- the interval's start, epoch ns
    service TEXT NOT NULL,
    k8s_namespace TEXT,
    k8s_pod TEXT,
    feature TEXT NOT NULL,
    method TEXT,
    route TEXT,
    status_code INTEGER,
    currency TEXT,
    requests INTEGER NOT NULL,
    duration_ns INTEGER NOT NULL,    -- their durations' sum
    durations TEXT NOT NULL,         -- JSON {bucket: requests}, summaries.DurationBuckets
    launches INTEGER NOT NULL,
    h2d_bytes INTEGER NOT NULL,
    d2h_bytes INTEGER NOT NULL,
    d2d_bytes INTEGER NOT NULL,
    other_bytes INTEGER NOT NULL,
    sync_ns INTEGER NOT NULL,
    gpu_seconds REAL NOT NULL,
    cost REAL NOT NULL,
    ambiguous REAL NOT NULL,
    nccl_calls INTEGER NOT NULL,
    nccl_bytes INTEGER NOT NULL,
    graph_kernels INTEGER NOT NULL,
    chunks INTEGER NOT NULL,
    split_requests INTEGER NOT NULL, -- requests whose time was split
    on_cpu REAL NOT NULL,
    cpu_wait REAL NOT NULL,
    gpu_sync REAL NOT NULL,
    blocked REAL NOT NULL,
    time_shared INTEGER NOT NULL
);
CREATE INDEX IF NOT EXISTS request_summaries_ts ON request_summaries (ts);
"""


# Columns added to existing tables since v1, by the version that added them: an older
# store gets them by ALTER TABLE (CREATE TABLE IF NOT EXISTS leaves its table as it is).
ADDED_COLUMNS = {
    3: (("requests", "nccl_calls", "INTEGER NOT NULL DEFAULT 0"),
        ("requests", "nccl_bytes", "INTEGER NOT NULL DEFAULT 0"),
        ("requests", "graph_kernels", "INTEGER NOT NULL DEFAULT 0")),
    4: (("requests", "chunks", "INTEGER NOT NULL DEFAULT 0"),),
    5: (("requests", "on_cpu", "REAL"), ("requests", "cpu_wait", "REAL"), ("requests", "gpu_sync", "REAL"),
        ("requests", "blocked", "REAL"), ("requests", "time_shared", "INTEGER NOT NULL DEFAULT 0")),
}


class StoreError(Exception):
    """A store that cannot be used; the message is one line for the user."""


def has_table(conn: sqlite3.Connection, name: str) -> bool:
    """A reader of an older store (no collector has migrated it) lacks newer tables."""
    row = conn.execute("SELECT 1 FROM sqlite_master WHERE type = 'table' AND name = ?", (name,)).fetchone()
    return row is not None


def columns(conn: sqlite3.Connection, table: str) -> set[str]:
    """A reader of an older store lacks newer columns too."""
    return {row[1] for row in conn.execute(f"PRAGMA table_info({table})")}


def _add_columns(conn: sqlite3.Connection) -> None:
    """Each added column a table lacks (by name, not by version: a half-migrated store
    cannot be, the migration is one transaction, but this stays right if it were)."""
    for added in ADDED_COLUMNS.values():
        for table, name, decl in added:
            if name not in columns(conn, table):
                conn.execute(f"ALTER TABLE {table} ADD COLUMN {name} {decl}")


def _check_version(conn: sqlite3.Connection, path: str) -> int:
    version = conn.execute("PRAGMA user_version").fetchone()[0]
    if version > SCHEMA_VERSION:
        raise StoreError(f"store {path} has schema v{version}, newer than this otel-gpu (v{SCHEMA_VERSION}): "
                         "upgrade otel-gpu or use another --db")
    return version


def _restrict(path: str, group: Optional[int]) -> None:
    """The store and its -wal/-shm: 0600, or 0640 for `group`. Set on every open, so a
    store an older otel-gpu left 0644 is closed too. (SQLite gives -wal/-shm files it
    creates the database file's mode and owner.)"""
    for f in (path, path + "-wal", path + "-shm"):
        if os.path.exists(f):
            if group is not None:
                os.chown(f, -1, group)
            os.chmod(f, 0o640 if group is not None else 0o600)


def _make_dir(parent: str, group: Optional[int]) -> None:
    """A directory we create is 0700, or 0750 for `group`; one that exists keeps its mode
    (it may be shared, such as /tmp): the file's own mode protects the store there."""
    if os.path.isdir(parent):
        return
    os.makedirs(parent, exist_ok=True)
    if group is not None:
        os.chown(parent, -1, group)
    os.chmod(parent, 0o750 if group is not None else 0o700)


def open_writer(path: str, group: Optional[int] = None) -> sqlite3.Connection:
    """Creates the file and the schema if needed, readable by root only, or by `group`
    (a gid) too. Raises StoreError, one line naming the path and the real cause (a full
    disk, a read-only filesystem, a permission), when the store cannot be written."""
    try:
        _make_dir(os.path.dirname(os.path.abspath(path)), group)
        if not os.path.exists(path):
            os.close(os.open(path, os.O_CREAT | os.O_WRONLY, 0o600))
        _restrict(path, group)
        return _open_schema(path)
    except OSError as e:
        raise StoreError(f"local store {path} cannot be written: {e.strerror or e}") from None
    except sqlite3.Error as e:
        raise StoreError(f"local store {path} cannot be written: {e}") from None


def _open_schema(path: str) -> sqlite3.Connection:
    # isolation_level=None: we issue BEGIN/COMMIT ourselves, one transaction per write().
    conn = sqlite3.connect(path, isolation_level=None, check_same_thread=False, timeout=10)
    try:
        conn.execute("PRAGMA journal_mode=WAL")  # persistent in the file: readers find it too
        conn.execute("PRAGMA synchronous=NORMAL")  # WAL + NORMAL: survives a collector crash
        conn.execute("BEGIN IMMEDIATE")
        _check_version(conn, path)
        # Idempotent: also adds an index a same-version store may lack, and migrates
        # an older one (new tables and indexes here, new columns in _add_columns).
        for stmt in filter(str.strip, _DDL.split(";")):
            conn.execute(stmt)
        _add_columns(conn)
        conn.execute(f"PRAGMA user_version = {SCHEMA_VERSION}")
        conn.execute("COMMIT")
    except BaseException:
        if conn.in_transaction:  # a failed ROLLBACK must not hide the real cause
            try:
                conn.execute("ROLLBACK")
            except sqlite3.Error:
                pass
        conn.close()
        raise
    return conn


def _connect_ro(path: str, immutable: bool) -> tuple[sqlite3.Connection, int]:
    uri = Path(path).resolve().as_uri() + "?mode=ro" + ("&immutable=1" if immutable else "")
    conn = sqlite3.connect(uri, uri=True, isolation_level=None, timeout=10)
    try:
        return conn, _check_version(conn, path)
    except BaseException:
        conn.close()
        raise


def open_reader(path: str) -> sqlite3.Connection:
    """Read-only: never creates the store, never takes a write lock."""
    if not os.path.exists(path):
        raise FileNotFoundError(path)
    try:
        try:
            conn, version = _connect_ro(path, immutable=False)
        except sqlite3.OperationalError:
            # No collector running: its clean exit removed the -wal/-shm files, and a
            # user cannot create them in root's directory. With no writer, the file
            # alone is the whole store, so reading it as immutable is exact.
            if os.path.exists(path + "-wal"):
                raise
            conn, version = _connect_ro(path, immutable=True)
    except sqlite3.DatabaseError as e:
        raise StoreError(f"cannot read store {path}: {e}") from None
    if version == 0:
        conn.close()
        raise StoreError(f"store {path} is empty (no schema yet): has `otel-gpu run` written to it?")
    return conn
