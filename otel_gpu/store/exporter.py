"""StoreExporter: an SDK SpanExporter writing each record's spans, one summary row per
SERVER span, and the GPU time of ambiguous/shared/outside windows (window_costs, read from
their root spans' cost attributes) to the local SQLite store, with bounded retention
(age and request count). An unsampled request that did not end in an error is summed into
its route's interval instead (store/summaries.py): the span builder sends only its SERVER
span when no other destination keeps unsampled spans."""
from __future__ import annotations

import json
import logging
import sqlite3
import threading
import time
from typing import Callable, Optional, Sequence

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanKind, StatusCode

from .. import semconv as sc
from ..ratelimit import RateLimitedLog, Stats
from .schema import StoreError, open_writer
from .summaries import COLUMNS as SUMMARY_COLUMNS
from .summaries import FLUSH_S, MAX_PENDING_COSTS, Summaries

log = logging.getLogger(__name__)

_SPAN_SQL = ("INSERT OR REPLACE INTO spans (trace_id, span_id, parent_span_id, group_ts, name, kind, start_ns,"
             " end_ns, status_code, status_message, attributes, service, pid)"
             " VALUES (?,?,?,?,?,?,?,?,?,?,?,?,?)")
_to_json = json.JSONEncoder(separators=(",", ":"), default=str).encode  # default: odd values as text

# requests column -> (SERVER span attribute, value when absent). The span builder sets
# these typed (int, float, str): they are stored as they are. NOT NULL columns default
# to 0 so every request has a row.
REQUEST_ATTRIBUTES = {
    "method": (sc.HTTP_REQUEST_METHOD, None),
    "route": (sc.HTTP_ROUTE, None),
    "status_code": (sc.HTTP_RESPONSE_STATUS_CODE, None),
    "launches": (sc.GPU_LAUNCHES, 0),
    "h2d_bytes": (sc.GPU_MEMCPY_H2D_BYTES, 0),
    "d2h_bytes": (sc.GPU_MEMCPY_D2H_BYTES, 0),
    "d2d_bytes": (sc.GPU_MEMCPY_D2D_BYTES, 0),
    "other_bytes": (sc.GPU_MEMCPY_OTHER_BYTES, 0),
    "sync_ns": (sc.GPU_SYNC_DURATION_NS, 0),
    "gpu_seconds": (sc.GPU_COST_SECONDS, 0.0),
    "cost": (sc.GPU_COST_AMOUNT, 0.0),
    "currency": (sc.GPU_COST_CURRENCY, None),
    "ambiguous": (sc.GPU_CALLS_AMBIGUOUS, 0),
    "nccl_calls": (sc.GPU_NCCL_CALLS, 0),  # set only when the request made any
    "nccl_bytes": (sc.GPU_NCCL_TOTAL_BYTES, 0),
    "graph_kernels": (sc.GPU_GRAPH_KERNEL_LAUNCHES, 0),
    "chunks": (sc.GPU_RESPONSE_CHUNKS, 0),
    "on_cpu": (sc.GPU_TIME_ON_CPU, None),  # pipeline/time_split.py: NULL when not split
    "cpu_wait": (sc.GPU_TIME_CPU_WAIT, None),
    "gpu_sync": (sc.GPU_TIME_GPU_SYNC, None),
    "blocked": (sc.GPU_TIME_BLOCKED, None),
    "time_shared": (sc.GPU_TIME_SHARED, 0),
}
# Columns not read from one span attribute: identity, resource, derived.
_OWN_COLUMNS = ("ts", "trace_id", "span_id", "service", "k8s_namespace", "k8s_pod", "feature", "duration_ns")
_REQUEST_COLUMNS = _OWN_COLUMNS + tuple(REQUEST_ATTRIBUTES)
_REQUEST_SQL = (f"INSERT INTO requests ({', '.join(_REQUEST_COLUMNS)})"
                f" VALUES ({', '.join('?' * len(_REQUEST_COLUMNS))})")
_COST_SQL = "UPDATE requests SET gpu_seconds = ?, cost = ?, currency = ? WHERE trace_id = ? AND span_id = ?"
_SUMMARY_INSERT_SQL = (f"INSERT INTO request_summaries ({', '.join(SUMMARY_COLUMNS)})"
                       f" VALUES ({', '.join('?' * len(SUMMARY_COLUMNS))})")
_SUMMARY_UPDATE_SQL = f"UPDATE request_summaries SET {', '.join(c + ' = ?' for c in SUMMARY_COLUMNS)} WHERE id = ?"
_WINDOW_SQL = ("INSERT INTO window_costs (ts, trace_id, span_id, service, pid, kind, feature, request_trace_id,"
               " request_span_id, gpu_seconds, cost, currency) VALUES (?,?,?,?,?,?,?,?,?,?,?,?)")


def _resource(span: ReadableSpan):
    return span.resource.attributes if span.resource is not None else {}


def _service(span: ReadableSpan) -> str:
    return _resource(span).get(sc.SERVICE_NAME) or "unknown_service"


def span_row(s: ReadableSpan, group_ts: int) -> tuple:
    parent = f"{s.parent.span_id:016x}" if s.parent is not None else None
    attrs = s.attributes or {}
    pid = _resource(s).get(sc.PROCESS_PID, attrs.get(sc.PROCESS_PID))  # resource first, as enrich sets it
    return (f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}", parent, group_ts, s.name,
            s.kind.value, s.start_time, s.end_time or s.start_time, s.status.status_code.value,
            s.status.description, _to_json(dict(attrs)), _service(s), pid)


def request_row(s: ReadableSpan) -> tuple:
    """The summary row of one SERVER span, columns in _REQUEST_COLUMNS order."""
    a = s.attributes or {}
    res = _resource(s)
    route = a.get(sc.HTTP_ROUTE)
    feature = a.get(sc.GPU_FEATURE) or route or a.get(sc.URL_PATH) or "(none)"
    own = (s.start_time, f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}", _service(s),
           res.get(sc.K8S_NAMESPACE_NAME), res.get(sc.K8S_POD_NAME), feature,
           max(0, (s.end_time or s.start_time) - s.start_time))
    return own + tuple(a.get(attr, default) for attr, default in REQUEST_ATTRIBUTES.values())


def summarised(s: ReadableSpan) -> bool:
    """A SERVER span kept as sums, not as a row and spans: its trace was not sampled and it
    did not end in an error (#45's decision: rows for sampled requests and errors)."""
    return not s.context.trace_flags.sampled and s.status.status_code is not StatusCode.ERROR


def window_rows(s: ReadableSpan) -> list[tuple]:
    """window_costs rows of a window's root span, from the cost attributes the span
    builder put on it: one per linked candidate's split share and one per feature of the
    candidates whose links were dropped (OTEL_SPAN_LINK_COUNT_LIMIT), or one for an outside
    window. A split that does not line up with the links goes to one "(unknown)" row, so the
    window's seconds are never lost."""
    a = s.attributes or {}
    seconds = a.get(sc.GPU_COST_SECONDS)
    if s.parent is not None or s.kind != SpanKind.INTERNAL or not seconds or sc.GPU_ATTRIBUTION not in a:
        return []
    cost, currency = a.get(sc.GPU_COST_AMOUNT) or 0.0, a.get(sc.GPU_COST_CURRENCY)
    head = (s.start_time, f"{s.context.trace_id:032x}", f"{s.context.span_id:016x}", _service(s),
            _resource(s).get(sc.PROCESS_PID, a.get(sc.PROCESS_PID)))
    if a[sc.GPU_ATTRIBUTION] == "outside":
        return [head + ("outside", None, None, None, seconds, cost, currency)]
    shares, features = a.get(sc.GPU_COST_SPLIT_SECONDS) or (), a.get(sc.GPU_COST_SPLIT_FEATURES) or ()
    rest_shares = a.get(sc.GPU_COST_SPLIT_REST_SECONDS) or ()
    rest_features = a.get(sc.GPU_COST_SPLIT_REST_FEATURES) or ()
    links = s.links or ()
    if not (len(shares) == len(features) == len(links) and len(rest_shares) == len(rest_features)):
        return [head + ("split", "(unknown)", None, None, seconds, cost, currency)]
    return [head + ("split", f, f"{link.context.trace_id:032x}", f"{link.context.span_id:016x}",
                    share, cost * share / seconds, currency)
            for share, f, link in zip(shares, features, links) if share] + \
        [head + ("split", f, None, None, share, cost * share / seconds, currency)  # links dropped: by feature
         for share, f in zip(rest_shares, rest_features) if share]


class _Rows:
    """What a pipeline batch gives the store (begin_batch .. end_batch), written in one
    transaction at its end."""
    __slots__ = ("spans", "requests", "windows", "costs")

    def __init__(self) -> None:
        self.spans: list[tuple] = []
        self.requests: list[tuple] = []
        self.windows: list[tuple] = []
        self.costs: list[tuple] = []  # _COST_SQL's parameters: rows of this batch or earlier ones


class StoreExporter(SpanExporter):
    """Called from the collector thread with the spans of ONE record: a request (SERVER
    span + children) or a window (INTERNAL root + children). Between begin_batch() and
    end_batch() (export/stage.py: one pipeline batch) the rows are kept and written in
    one transaction at its end: a transaction a request cost a sampled request ~100 µs of
    the collector's CPU (docs/performance.md note 43). Outside a batch, one transaction each.

    A request summarised (`summarised`) adds to its summary in memory, written at most every
    FLUSH_S (at a write, or at the pipeline's Tick: tick()) and at shutdown.

    Retention is checked cheaply: the request count is kept in memory (one count(*) at
    start), and when it passes max_requests the oldest are deleted down to a little
    below it (so deletes come in chunks, not per row); age is enforced at most every
    prune_interval_s. Spans go with their request (same group_ts); windows, which have
    no request row, go by age or when older than the oldest request kept."""
    summarises_unsampled = True  # export/destinations.py: send it unsampled requests' SERVER spans

    def __init__(self, path: str, retention_s: float = 7 * 86400, max_requests: int = 1_000_000,
                 prune_interval_s: float = 5.0, now_ns: Callable[[], int] = time.time_ns,
                 stats: Optional[Stats] = None, group: Optional[int] = None) -> None:
        if max_requests < 1 or retention_s <= 0:
            raise ValueError("store retention: max_requests >= 1 and retention_s > 0 are required")
        self.path = path
        self.retention_ns = int(retention_s * 1e9)
        self.max_requests = max_requests
        self._slack = max(1, min(max_requests // 10, 1000))
        self._interval_ns = int(prune_interval_s * 1e9)
        self._now_ns = now_ns
        self._lock = threading.Lock()
        self.stats = stats or Stats()
        self._log = RateLimitedLog(log, self.stats, interval_s=30.0)
        self._conn: Optional[sqlite3.Connection] = open_writer(path, group)
        self._count = self._conn.execute("SELECT count(*) FROM requests").fetchone()[0]
        self._next_age_prune = 0
        self._summaries = Summaries()
        self._next_summary_flush = 0
        self.spans_written = self.requests_written = self.rows_pruned = self.write_errors = 0
        self.requests_summed = 0
        self._batch: Optional[_Rows] = None  # rows kept until end_batch()
        self._last_error = ""
        if not self._transaction(lambda: None):  # apply limits to a store left by an older run
            self.shutdown()
            raise StoreError(f"local store {path} cannot be written: {self._last_error}")

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if not spans:
            return SpanExportResult.SUCCESS
        servers = [s for s in spans if s.kind == SpanKind.SERVER]
        if len(servers) == 1 and summarised(servers[0]):
            self._summarise(servers[0])
            return SpanExportResult.SUCCESS
        group_ts = min(s.start_time for s in (servers or spans))
        rows = self._batch or _Rows()
        rows.spans += [span_row(s, group_ts) for s in spans]
        rows.requests += [request_row(s) for s in servers]
        rows.windows += [row for s in spans if s.parent is None for row in window_rows(s)]
        if rows is self._batch:
            return SpanExportResult.SUCCESS  # written at end_batch(), its failure counted there
        return SpanExportResult.SUCCESS if self._write(rows) else SpanExportResult.FAILURE

    def begin_batch(self) -> None:
        """Keeps what the next exports and costs write, until end_batch()."""
        self.end_batch()
        self._batch = _Rows()

    def end_batch(self) -> None:
        """Writes what was kept since begin_batch(), in one transaction."""
        rows, self._batch = self._batch, None
        if rows is not None and (rows.spans or rows.costs):
            self._write(rows)

    def _write(self, rows: _Rows) -> bool:
        def insert() -> None:
            self._conn.executemany(_SPAN_SQL, rows.spans)
            self._conn.executemany(_REQUEST_SQL, rows.requests)
            self._conn.executemany(_WINDOW_SQL, rows.windows)
            self._conn.executemany(_COST_SQL, rows.costs)  # after the inserts: a cost may be a row's of this batch
        if not self._transaction(insert, len(rows.requests)):
            # Counted per span and per cost, as every other destination's drops (one line per 30 s).
            self._log.event("store_write_failed", logging.WARNING,
                            "local store %s: %d spans (%d requests) and %d costs not written: %s", self.path,
                            len(rows.spans), len(rows.requests), len(rows.costs), self._last_error,
                            count=len(rows.spans) + len(rows.costs))
            return False
        self.spans_written += len(rows.spans)
        self.requests_written += len(rows.requests)
        return True

    def _summarise(self, server: ReadableSpan) -> None:
        row = dict(zip(_REQUEST_COLUMNS, request_row(server)))
        if not self._summaries.add(row, bool((server.attributes or {}).get(sc.GPU_COST_PENDING))):
            self._log.event("store_summary_costs_dropped", logging.WARNING,
                            "local store %s: %d summarised requests await their cost: the oldest is let go "
                            "(its cost will not be in the store)", self.path, MAX_PENDING_COSTS)
        self.requests_summed += 1
        self.tick()

    def tick(self) -> None:
        """The summaries changed since their last write, if FLUSH_S has passed."""
        now = self._now_ns()
        if now >= self._next_summary_flush:
            self._next_summary_flush = now + int(FLUSH_S * 1e9)
            self._write_summaries(now)

    def _write_summaries(self, now_ns: int) -> None:
        taken = self._summaries.take_dirty(now_ns)
        if not taken:
            return
        new = [s for s in taken if s.rowid is None]

        def write() -> None:
            for s in taken:
                if s.rowid is None:
                    s.rowid = self._conn.execute(_SUMMARY_INSERT_SQL, s.values()).lastrowid
                else:
                    self._conn.execute(_SUMMARY_UPDATE_SQL, (*s.values(), s.rowid))
        if not self._transaction(write):
            for s in new:  # rolled back: inserted again at the next try
                s.rowid = None
            self._summaries.failed(taken)
            self._log.event("store_write_failed", logging.WARNING,
                            "local store %s: %d request summaries not written (tried again): %s", self.path,
                            len(taken), self._last_error)

    def settle_cost(self, trace_id: int, span_id: int, gpu_seconds: float, cost: float, currency: str) -> None:
        """A request's cost settled after its span was written (pipeline/cost.py), or after
        it was summarised."""
        ids = (f"{trace_id:032x}", f"{span_id:016x}")
        if self._summaries.settle_cost(ids[1], gpu_seconds, cost, currency):
            self.tick()
            return
        rows = self._batch or _Rows()
        rows.costs.append((gpu_seconds, cost, currency, *ids))
        if rows is not self._batch:
            self._write(rows)

    def _transaction(self, body: Callable[[], None], new_requests: int = 0) -> bool:
        """body() and any due pruning in one transaction. Errors are kept for the caller to
        count, never raised into the collector: a full disk must not stop the traces going
        to OTLP, and the next write is tried afresh (the disk may have room again). A value
        SQLite cannot bind (an integer past int64: OverflowError, not an sqlite3.Error) fails
        its transaction the same way: left open, it failed every write after it."""
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
            except (sqlite3.Error, OverflowError) as e:
                if self._conn.in_transaction:
                    try:
                        self._conn.execute("ROLLBACK")
                    except sqlite3.Error:
                        pass  # SQLite has rolled back itself; the cause is e
                self.write_errors += 1
                self._last_error = str(e)
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
        self.rows_pruned += self._conn.execute("DELETE FROM window_costs WHERE ts < ?", (ts,)).rowcount
        self.rows_pruned += self._conn.execute("DELETE FROM request_summaries WHERE ts < ?", (ts,)).rowcount
        return gone

    def shutdown(self) -> None:
        if self._conn is not None:
            self.end_batch()
            self._write_summaries(self._now_ns())
        with self._lock:
            if self._conn is not None:
                self._conn.close()
                self._conn = None
