"""StoreSink: writes each request's spans, and one summary row per SERVER span, to the
local SQLite store, with bounded retention (age and request count)."""
from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from typing import Callable, Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanKind

from .. import semconv as sc
from .schema import open_writer

log = logging.getLogger(__name__)

_SPAN_SQL = ("INSERT OR REPLACE INTO spans (trace_id, span_id, parent_span_id, group_ts, name, kind, start_ns,"
             " end_ns, status_code, status_message, attributes, service, pid)"
             " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)")
_REQUEST_COLUMNS = ("ts", "trace_id", "span_id", "service", "k8s_namespace", "k8s_pod", "method", "route",
                    "feature", "status_code", "duration_ns", "launches", "h2d_bytes", "d2h_bytes",
                    "d2d_bytes", "other_bytes", "sync_ns", "gpu_seconds", "cost", "currency", "ambiguous")
_to_json = json.JSONEncoder(separators=(",", ":"), default=str).encode  # default: odd values as text
_REQUEST_SQL = (f"INSERT INTO requests ({', '.join(_REQUEST_COLUMNS)})"
                f" VALUES ({', '.join('?' * len(_REQUEST_COLUMNS))})")


def _num(v, cast=int):
    """Attribute value as a number; absent or malformed counts as 0 (a summary row must exist)."""
    try:
        return cast(v) if v is not None else cast(0)
    except (TypeError, ValueError):
        return cast(0)


def _service(span: ReadableSpan) -> str:
    res = span.resource.attributes if span.resource is not None else {}
    return str(res.get(sc.SERVICE_NAME) or "unknown_service")


def _lookup(span: ReadableSpan, key: str):
    """Resource first (k8s/process attributes live there), then the span."""
    if span.resource is not None and key in span.resource.attributes:
        return span.resource.attributes[key]
    return (span.attributes or {}).get(key)


def span_row(s: ReadableSpan, group_ts: int) -> tuple:
    parent = f"{s.parent.span_id:016x}" if s.parent is not None else None
    attrs = _to_json(dict(s.attributes or {}))
    pid = _lookup(s, sc.PROCESS_PID)
    return (f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}", parent, group_ts, s.name,
            s.kind.value, s.start_time, s.end_time or s.start_time, s.status.status_code.value,
            s.status.description, attrs, _service(s), _num(pid) if pid is not None else None)


def request_row(s: ReadableSpan) -> tuple:
    a = s.attributes or {}
    route = a.get(sc.HTTP_ROUTE)
    feature = a.get(sc.GPU_FEATURE) or route or a.get(sc.URL_PATH) or "(none)"
    status = a.get(sc.HTTP_RESPONSE_STATUS_CODE)
    return (s.start_time, f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}", _service(s),
            _lookup(s, sc.K8S_NAMESPACE_NAME), _lookup(s, sc.K8S_POD_NAME), a.get(sc.HTTP_REQUEST_METHOD),
            route, str(feature), _num(status) if status is not None else None,
            max(0, (s.end_time or s.start_time) - s.start_time), _num(a.get(sc.GPU_LAUNCHES)),
            _num(a.get(sc.GPU_MEMCPY_H2D_BYTES)), _num(a.get(sc.GPU_MEMCPY_D2H_BYTES)),
            _num(a.get(sc.GPU_MEMCPY_D2D_BYTES)), _num(a.get(sc.GPU_MEMCPY_OTHER_BYTES)),
            _num(a.get(sc.GPU_SYNC_DURATION_NS)), _num(a.get(sc.GPU_COST_SECONDS), float),
            _num(a.get(sc.GPU_COST_AMOUNT), float), a.get(sc.GPU_COST_CURRENCY),
            _num(a.get(sc.GPU_CALLS_AMBIGUOUS)))


class StoreSink:
    """Called from the collector thread with the spans of ONE request (SERVER span +
    children) or ONE window (INTERNAL root + children) at a time; one transaction each.

    Retention is checked cheaply: the request count is kept in memory (one count(*) at
    start), and when it passes max_requests the oldest are deleted down to a little
    below it (so deletes come in chunks, not per row); age is enforced at most every
    prune_interval_s. Spans go with their request (same group_ts); windows, which have
    no request row, go by age or when older than the oldest request kept."""

    def __init__(self, path: str, retention_s: float = 7 * 86400, max_requests: int = 1_000_000,
                 prune_interval_s: float = 5.0, now_ns: Callable[[], int] = time.time_ns) -> None:
        if max_requests < 1 or retention_s <= 0:
            raise ValueError("store retention: max_requests >= 1 and retention_s > 0 are required")
        self.path = path
        self.retention_ns = int(retention_s * 1e9)
        self.max_requests = max_requests
        self._slack = max(1, min(max_requests // 10, 1000))
        self._interval_ns = int(prune_interval_s * 1e9)
        self._now_ns = now_ns
        self._lock = threading.Lock()
        self._conn: Optional[sqlite3.Connection] = open_writer(path)
        self._count = self._conn.execute("SELECT count(*) FROM requests").fetchone()[0]
        self._next_age_prune = 0
        self.spans_written = self.requests_written = self.rows_pruned = self.write_errors = 0
        self._transaction(lambda: None)  # apply limits to a store left by an older run

    def write(self, spans: Sequence[ReadableSpan]) -> None:
        if not spans:
            return
        servers = [s for s in spans if s.kind == SpanKind.SERVER]
        group_ts = min(s.start_time for s in (servers or spans))
        span_rows = [span_row(s, group_ts) for s in spans]
        request_rows = [request_row(s) for s in servers]

        def insert() -> None:
            self._conn.executemany(_SPAN_SQL, span_rows)
            self._conn.executemany(_REQUEST_SQL, request_rows)
        if self._transaction(insert, len(request_rows)):
            self.spans_written += len(span_rows)
            self.requests_written += len(request_rows)

    def _transaction(self, body: Callable[[], None], new_requests: int = 0) -> bool:
        """body() and any due pruning in one transaction. Errors are logged, never raised
        into the collector: a full disk must not stop the traces going to OTLP."""
        with self._lock:
            if self._conn is None:
                return False
            try:
                self._conn.execute("BEGIN IMMEDIATE")
                body()
                count = self._count + new_requests
                count -= self._prune(count)
                self._conn.execute("COMMIT")
                self._count = count
                return True
            except sqlite3.Error as e:
                if self._conn.in_transaction:
                    self._conn.execute("ROLLBACK")
                self.write_errors += 1
                if self.write_errors == 1 or self.write_errors % 1000 == 0:
                    log.warning("local store %s: write failed (%d so far): %s", self.path, self.write_errors, e)
                return False

    def _prune(self, count: int) -> int:
        """Deletes what is past the bounds; returns how many request rows went."""
        gone = 0
        now = self._now_ns()
        if now >= self._next_age_prune:
            self._next_age_prune = now + self._interval_ns
            gone += self._delete_before(now - self.retention_ns)
        if count - gone > self.max_requests:
            drop = count - gone - (self.max_requests - self._slack)
            # The oldest request kept; everything that started before it goes.
            row = self._conn.execute("SELECT ts FROM requests ORDER BY ts LIMIT 1 OFFSET ?", (drop,)).fetchone()
            gone += self._delete_before(row[0]) if row else self._delete_before(now + 1)
        return gone

    def _delete_before(self, ts: int) -> int:
        gone = self._conn.execute("DELETE FROM requests WHERE ts < ?", (ts,)).rowcount
        self.rows_pruned += gone + self._conn.execute("DELETE FROM spans WHERE group_ts < ?", (ts,)).rowcount
        return gone

    def shutdown(self) -> None:
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
