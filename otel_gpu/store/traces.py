"""`otel-gpu traces`: recent requests one line each, or one trace as a tree. Text read
from the store is sanitised as it is read: a store written by an older version may hold
escape sequences from the network."""
from __future__ import annotations

import json
from datetime import datetime
from typing import Optional

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, Status, StatusCode, TraceFlags

from .. import sanitize
from .. import semconv as sc
from ..span_tree import render_tree
from .report import TIME_PARTS
from .schema import columns, has_table
from .summaries import DurationBuckets, buckets_of
from .text import fit, split_width

TREE_NOTE = "CUDA call durations are host-side enqueue times, not GPU execution."
_SHORT = 12  # trace id digits shown in the list; --trace-id takes any unique prefix
# The list's filter, for its requests and for the summaries of those it cannot list.
_FILTER = """WHERE ts >= :since AND (:service IS NULL OR service = :service)
  AND (:route IS NULL OR route = :route OR feature = :route)"""
_LIST_SQL = f"""
SELECT ts, trace_id, service, method, route, status_code, duration_ns, launches{{times}} FROM requests
{_FILTER}
ORDER BY {{order}} LIMIT :limit
"""


def list_requests(conn, since_ns: Optional[int] = None, service: Optional[str] = None,
                  route: Optional[str] = None, slowest: Optional[int] = None, limit: int = 20) -> list[dict]:
    """Newest first, or the `slowest` N by duration (slowest first)."""
    order = "duration_ns DESC, ts DESC" if slowest else "ts DESC"
    params = {"since": since_ns if since_ns is not None else -(2 ** 63), "service": service,
              "route": route, "limit": slowest or limit}
    keys = ("ts", "trace_id", "service", "method", "route", "status_code", "duration_ns", "launches")
    times = "on_cpu" in columns(conn, "requests")  # v5: where each request's time went
    sql = _LIST_SQL.format(order=order, times=", " + ", ".join(TIME_PARTS) + ", time_shared" if times else "")
    out = []
    for r in conn.execute(sql, params):
        row = {k: sanitize.optional(v) for k, v in zip(keys, r)}
        split = r[len(keys):len(keys) + len(TIME_PARTS)]
        row["time_split"] = dict(zip(TIME_PARTS, split)) if times and None not in split else None
        row["time_shared"] = bool(times and r[-1])
        out.append(row)
    return out


_SUMMARISED_SQL = f"SELECT requests, durations FROM request_summaries {_FILTER}"


def summarised_note(conn, since_ns: Optional[int] = None, service: Optional[str] = None,
                    route: Optional[str] = None) -> Optional[str]:
    """What a list of the same filter leaves out: the requests the store summarised (not
    sampled, no error: no row, no trace to list), how many and the upper bound of the
    slowest one's duration bucket; None when there are none."""
    if not has_table(conn, "request_summaries"):
        return None
    params = {"since": since_ns if since_ns is not None else -(2 ** 63), "service": service, "route": route}
    n, top = 0, -1
    for count, durations in conn.execute(_SUMMARISED_SQL, params):
        n += count
        top = max(top, max(buckets_of(durations), default=-1))
    if not n:
        return None
    return (f"{n} more requests were summarised, not kept (not sampled, no error): not listed; the slowest of "
            f"them took at most {DurationBuckets.bound(top) / 1e6:.1f} ms")


def _when(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9).strftime("%m-%d %H:%M:%S")  # local: the user's clock


def format_list(rows: list[dict], width: int = 80) -> str:
    """One request a line, within `width` columns. The service column is left out when
    all rows share one service (it goes in the header instead)."""
    if not rows:
        return "no requests in the store for this filter"
    services = sorted({r["service"] for r in rows})
    fixed = 14 + 1 + _SHORT + 1 + 4 + 1 + 9 + 1 + 8  # time, trace, status, duration, launches
    reqs = [f"{r['method'] or '?'} {r['route'] or '?'}" for r in rows]
    name_w = width - fixed - 1
    svc_w, req_w = split_width(name_w, services, reqs) if len(services) > 1 else (0, name_w)

    def line(when, trace, svc, req, status, dur, launches) -> str:
        cells = [f"{when:14}", f"{trace:{_SHORT}}"] + ([fit(svc, svc_w)] if svc_w else [])
        return " ".join(cells + [fit(req, req_w), f"{status:>4}", f"{dur:>9}", f"{launches:>8}"])

    lines = [f"service {services[0]}" if not svc_w else f"{len(services)} services",
             line("TIME", "TRACE", "SERVICE", "REQUEST", "HTTP", "DURATION", "LAUNCHES")]
    for r, req in zip(rows, reqs):
        lines.append(line(_when(r["ts"]), r["trace_id"][:_SHORT], r["service"], req, str(r["status_code"] or "-"),
                          f"{r['duration_ns'] / 1e6:.1f} ms", str(r["launches"])))
    lines.append("show one: otel-gpu traces --trace-id TRACE (duration: the HTTP request's)")
    return "\n".join(lines)


def resolve_trace_id(conn, prefix: str) -> list[str]:
    """Full trace ids starting with `prefix` (at most two: enough to say "ambiguous")."""
    p = prefix.strip().lower()
    if not p or any(c not in "0123456789abcdef" for c in p) or len(p) > 32:
        raise ValueError(f"--trace-id {prefix!r}: expected up to 32 hex digits")
    # A range scan on the primary key, where LIKE could not use it.
    hi = p[:-1] + chr(ord(p[-1]) + 1) if len(p) < 32 else p + "\x00"
    rows = conn.execute("SELECT DISTINCT trace_id FROM spans WHERE trace_id >= ? AND trace_id < ? LIMIT 2",
                        (p, hi))
    return [r[0] for r in rows]


def _ctx(trace_id: str, span_id: str, remote: bool = False) -> SpanContext:
    return SpanContext(int(trace_id, 16), int(span_id, 16), is_remote=remote,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED))


def trace_spans(conn, trace_id: str) -> list[ReadableSpan]:
    """Stored rows back as SDK spans, so the console renderer draws them."""
    rows = conn.execute("SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code,"
                        " status_message, attributes, service, pid FROM spans WHERE trace_id = ?", (trace_id,))
    spans = []
    for (tid, sid, parent, name, kind, start, end, code, msg, attrs, service, pid) in rows:
        res = {sc.SERVICE_NAME: sanitize.text(service or "unknown_service")}
        if pid is not None:
            res[sc.PROCESS_PID] = pid
        spans.append(ReadableSpan(
            name=sanitize.text(name), context=_ctx(tid, sid),
            parent=_ctx(tid, parent, remote=True) if parent else None,
            resource=Resource(res), attributes=sanitize.attributes(json.loads(attrs)), kind=SpanKind(kind),
            # The SDK warns about a description on a non-ERROR status.
            status=Status(StatusCode(code), sanitize.optional(msg) if code == StatusCode.ERROR.value else None),
            start_time=start, end_time=end))
    return spans


def format_tree(spans: list[ReadableSpan]) -> str:
    start = min(s.start_time for s in spans)
    return f"# started {_when(start)} (local time)\n# {TREE_NOTE}\n{render_tree(spans)}"
