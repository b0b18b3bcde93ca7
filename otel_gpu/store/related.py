"""The GPU-work windows (ambiguous, shared, outside) that bear on stored requests: the
calls a request may own but that no single request was given (export/spans.py puts
them on window traces of their own).

A window is related to a request when its cost was split to it (window_costs names the
request), or when it ran in the request's process while the request was open."""
from __future__ import annotations

from opentelemetry.trace import SpanKind

from .. import semconv as sc
from .schema import has_table

# Windows are cut at most every few seconds (pipeline/attribution.py); one that started this
# long before a request began is not looked for, which keeps the scans on the ts indexes.
LOOKBACK_NS = 60 * 10**9

_SPLIT_SQL = ("SELECT DISTINCT trace_id, request_trace_id FROM window_costs"
              " WHERE ts >= ? AND ts <= ? AND kind = 'split'")
# Root INTERNAL spans are windows (a request's root is its SERVER span).
_ROOTS_SQL = ("SELECT trace_id, pid, start_ns, end_ns FROM spans INDEXED BY spans_group_ts"
              " WHERE group_ts >= ? AND group_ts <= ? AND parent_span_id IS NULL AND kind = ?")


def related_windows(conn, requests: list[dict]) -> list[str]:
    """Trace ids of the windows related to `requests` (dicts with trace_id, pid, start_ns,
    end_ns), in start order."""
    if not requests:
        return []
    lo = min(r["start_ns"] for r in requests) - LOOKBACK_NS
    hi = max(r["end_ns"] for r in requests)
    wanted = {r["trace_id"] for r in requests}
    found = {}
    if has_table(conn, "window_costs"):
        for window, request in conn.execute(_SPLIT_SQL, (lo, hi)):
            if request in wanted:
                found[window] = None
    by_pid: dict = {}
    for r in requests:
        by_pid.setdefault(r["pid"], []).append((r["start_ns"], r["end_ns"]))
    starts = {}
    for trace_id, pid, start, end in conn.execute(_ROOTS_SQL, (lo, hi, SpanKind.INTERNAL.value)):
        starts[trace_id] = start
        if any(start < r_end and end > r_start for r_start, r_end in by_pid.get(pid, ())):
            found[trace_id] = None
    return sorted(found, key=lambda t: starts.get(t, 0))


def request_bounds(spans) -> list[dict]:
    """related_windows()'s input from one stored trace: its SERVER spans."""
    return [{"trace_id": f"{s.context.trace_id:032x}", "pid": (s.resource.attributes or {}).get(sc.PROCESS_PID),
             "start_ns": s.start_time, "end_ns": s.end_time}
            for s in spans if s.kind == SpanKind.SERVER]


def traces_with_windows(conn, trace_ids: list[str]) -> tuple[list[list], list[list]]:
    """The stored traces (as SDK spans, traces.trace_spans) and those of their related windows."""
    from .traces import trace_spans
    requests = [trace_spans(conn, t) for t in trace_ids]
    requests = [spans for spans in requests if spans]
    windows = related_windows(conn, [b for spans in requests for b in request_bounds(spans)])
    return requests, [spans for spans in (trace_spans(conn, t) for t in windows if t not in trace_ids) if spans]
