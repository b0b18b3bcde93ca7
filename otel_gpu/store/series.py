"""GPU seconds and cost per (service, feature) over time, for the HTML report's charts.

Counted as `report` counts them (report.py): a request's exact time in the bucket of its
start, each split share of an ambiguous/shared window and each outside window in the bucket
of the window's start, under the same feature (None: outside). Summed over the buckets,
each feature's figures are its report row's."""
from __future__ import annotations

from typing import Optional

from .report import _FILTER
from .schema import has_table

# Bucket widths a reader can name; the first that gives at most `buckets` buckets.
_STEPS_S = (1, 2, 5, 10, 15, 30, 60, 120, 300, 600, 900, 1800, 3600, 7200, 4 * 3600, 12 * 3600, 86400, 7 * 86400)
_REQUESTS_SQL = f"""
SELECT (ts - :origin) / :step, service, feature, SUM(gpu_seconds), SUM(cost)
FROM requests INDEXED BY requests_ts {_FILTER} GROUP BY 1, 2, 3"""
_SUMMARIES_SQL = _REQUESTS_SQL.replace("requests INDEXED BY requests_ts", "request_summaries")
_WINDOWS_SQL = f"""
SELECT (ts - :origin) / :step, service, CASE kind WHEN 'outside' THEN NULL ELSE feature END,
       SUM(gpu_seconds), SUM(cost)
FROM window_costs {_FILTER} GROUP BY 1, 2, 3"""


def _tables(conn) -> list[str]:
    """The tables with GPU seconds by time that this store has (older ones lack the later)."""
    return ["requests"] + [t for t in ("window_costs", "request_summaries") if has_table(conn, t)]


def _span(conn, params: dict) -> Optional[tuple[int, int]]:
    lo_hi = [conn.execute(f"SELECT MIN(ts), MAX(ts) FROM {t} {_FILTER}", params).fetchone() for t in _tables(conn)]
    lows = [lo for lo, _ in lo_hi if lo is not None]
    return (min(lows), max(hi for _, hi in lo_hi if hi is not None)) if lows else None


def cost_series(conn, since_ns: Optional[int] = None, service: Optional[str] = None, buckets: int = 60) -> dict:
    """{"step_s", "starts" (epoch ns of each bucket), "series": {(service, feature):
    {"gpu_seconds": [...], "cost": [...]}}}, one value per bucket; empty when nothing is in range."""
    params = {"since": since_ns if since_ns is not None else -(2 ** 63), "service": service}
    conn.execute("BEGIN")
    try:
        span = _span(conn, params)
        if span is None:
            return {"step_s": None, "starts": [], "series": {}}
        lo, hi = span
        step_s = next((s for s in _STEPS_S if (hi - lo) // (s * 10**9) + 1 <= buckets), _STEPS_S[-1])
        step = step_s * 10**9
        origin = lo - lo % step  # whole steps since the epoch: buckets start on round times
        n = (hi - origin) // step + 1
        series: dict = {}
        params.update(origin=origin, step=step)
        sql_of = {"requests": _REQUESTS_SQL, "window_costs": _WINDOWS_SQL, "request_summaries": _SUMMARIES_SQL}
        for sql in (sql_of[t] for t in _tables(conn)):
            for b, svc, feature, seconds, cost in conn.execute(sql, params).fetchall():
                s = series.setdefault((svc, feature), {"gpu_seconds": [0.0] * n, "cost": [0.0] * n})
                s["gpu_seconds"][b] += seconds or 0.0
                s["cost"][b] += cost or 0.0
    finally:
        conn.execute("COMMIT")
    return {"step_s": step_s, "starts": [origin + i * step for i in range(n)], "series": series}
