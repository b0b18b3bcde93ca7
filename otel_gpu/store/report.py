"""`otel-gpu report`: per-(service, feature) GPU usage and cost from the local store.

Rows are grouped by (service, feature), where feature is `otel_gpu.feature` on the
server span, or its `http.route` when unset. A feature's GPU time is what its requests
were charged exactly plus its split shares of ambiguous and shared windows (a shared
window's shares count under the service of the process that did the work); each service also has
one row (feature null) for its processes' GPU time outside requests. Over all rows the
GPU seconds add up to the processes' busy time (pipeline/cost.py). Sorted by cost, then
GPU seconds, then requests, all descending.

`--format json` prints one object:

    since         ISO-8601 UTC cutoff: only requests that started at or after it count;
                  null when every request kept in the store counts
    service       the --service filter, or null
    generated_at  ISO-8601 UTC time the report was made
    currency      currency of `cost` (e.g. "USD"); null when no request carried one;
                  "mixed" when requests carried different currencies
    share_of      what `share` divides: "cost", or "gpu_seconds" when the total cost is 0,
                  or "requests" when both are 0
    rows          list, one object per (service, feature):
        service               service.name of the process that served the requests
        feature               otel_gpu.feature, else http.route; null: the row of the
                              service's GPU time outside requests
        requests              number of requests
        summarised            of them, requests kept as sums, not rows (unsampled, no error:
                              request_summaries, store/summaries.py); 0 in a store older than v6
        p50_ms, p95_ms        request latency percentiles in ms (nearest rank), null if none
        percentiles           "exact": read from the requests' rows; "buckets": the rank fell
                              among summarised requests, and the value is their duration
                              bucket's upper bound (at most 9 % above the true value)
        launches_per_request  mean kernel launches per request
        copy_bytes            total bytes copied by cudaMemcpy* (h2d + d2h + d2d + other)
        nccl_calls            NCCL collectives and send/recv (gpu.nccl.calls); 0 in a store
                              older than v3
        nccl_bytes            their bytes, what each rank received (send: sent) (gpu.nccl.total_bytes)
        gpu_seconds           estimated GPU seconds: exact + split + outside
        exact_gpu_seconds     charged to the requests themselves (otel_gpu.cost.gpu_seconds)
        split_gpu_seconds     shares of ambiguous and shared windows' time, split among their
                              candidate requests by overlap (otel_gpu.cost.split.gpu_seconds)
        outside_gpu_seconds   GPU time outside any request (outside windows); only in
                              the feature-null row
        cost                  estimated cost of gpu_seconds (otel_gpu.cost.amount), in `currency`
        share                 fraction (0..1) of the total `share_of`; rows sum to 1
    totals        the same fields as a row without service and feature, over all rows
                  (share is 1, or 0 when there are no requests)
    per_chunk     list, one object per feature whose responses stream (more response
                  chunks than requests; chunks: otel_gpu.response.chunks, a token each for
                  SSE), most costly chunk first; empty in a store older than v4:
        feature               as in rows
        chunks                response chunks its requests wrote
        gpu_seconds           its exact + split GPU seconds, over every service (a batching
                              engine's shares count under the engine's service)
        gpu_seconds_per_chunk gpu_seconds / chunks
        cost_per_chunk        cost / chunks, in `currency`
    time_split    list, one object per (service, feature) with requests whose time was split
                  on their serving thread (otel_gpu.time.*), most time first; empty in a
                  store older than v5:
        service, feature      as in rows
        requests              requests split
        shared                of them, split on a thread that also served other work
                              (otel_gpu.time.shared): the thread's time, not theirs alone
        on_cpu_ms, cpu_wait_ms, gpu_sync_ms, blocked_ms
                              the mean per split request: running, waiting for a CPU,
                              inside a synchronising GPU call, off the CPU otherwise

Summarised requests count in every figure (requests, calls, bytes, GPU seconds, cost,
chunks, the time split) by their interval's start (summaries.INTERVAL_S), as a row counts
by its request's start.

Latency is the HTTP request time seen at the socket. GPU seconds and cost are the
collector's host-side estimates; CUDA call durations are enqueue times, not GPU time.
"""
from __future__ import annotations

import json
from datetime import datetime, timezone
from typing import Optional

from .. import sanitize
from .schema import columns, has_table
from .since import iso_utc
from .summaries import TIME_PARTS, buckets_of, percentile

ROW_FIELDS = ("service", "feature", "requests", "summarised", "p50_ms", "p95_ms", "percentiles", "launches_per_request",
              "copy_bytes", "nccl_calls", "nccl_bytes", "gpu_seconds", "exact_gpu_seconds", "split_gpu_seconds", "outside_gpu_seconds",
              "cost", "share")
TOTAL_FIELDS = ROW_FIELDS[2:]
REPORT_FIELDS = ("since", "service", "generated_at", "currency", "share_of", "rows", "totals", "per_chunk",
                 "time_split")

_FILTER = "WHERE ts >= :since AND (:service IS NULL OR service = :service)"
# Indexes are named: without ANALYZE statistics SQLite walks the latency index for the
# GROUP BY, a random-access read of the whole table even for --since 15m.
# TOTAL, not SUM, for counts: spans clamp absurd values to 2^63-1, and SQLite's integer
# SUM raises "integer overflow" on two of them.
_GROUPS_SQL = f"""
SELECT service, feature, COUNT(*), TOTAL(launches), TOTAL(h2d_bytes + d2h_bytes + d2d_bytes + other_bytes),
       {{nccl}}, SUM(gpu_seconds), SUM(cost)
FROM requests INDEXED BY requests_ts {_FILTER} GROUP BY service, feature"""
_NCCL_SUMS = "TOTAL(nccl_calls), TOTAL(nccl_bytes)"  # "0, 0" on a store older than v3
# The k-th fastest request of a group: an in-order walk of the covering latency index,
# no sort (SQLite's window functions took ~25x longer on 100k requests).
_NTH_IN_GROUP_SQL = ("SELECT duration_ns FROM requests INDEXED BY requests_latency"
                     " WHERE service = ? AND feature = ? AND ts >= ? ORDER BY duration_ns LIMIT 1 OFFSET ?")
_SORTED_SQL = f"SELECT duration_ns FROM requests INDEXED BY requests_ts {_FILTER} ORDER BY duration_ns"
_CURRENCY_SQL = f"SELECT DISTINCT currency FROM requests {_FILTER} AND currency IS NOT NULL AND currency != ''"
_WINDOWS_SQL = f"""
SELECT service, CASE kind WHEN 'outside' THEN NULL ELSE feature END, kind, SUM(gpu_seconds), SUM(cost)
FROM window_costs {_FILTER} GROUP BY 1, 2, 3"""
_WINDOW_CURRENCY_SQL = _CURRENCY_SQL.replace("FROM requests", "FROM window_costs")
# Streaming features: more response chunks than requests (an answer in one write is one chunk).
_CHUNKS_SQL = f"SELECT feature, TOTAL(chunks), COUNT(*) FROM requests {_FILTER} GROUP BY feature"
_TIME_SQL = (f"SELECT service, feature, COUNT(*), TOTAL(time_shared), "
             f"{', '.join(f'TOTAL({p})' for p in TIME_PARTS)} FROM requests {_FILTER} AND on_cpu IS NOT NULL "
             f"GROUP BY service, feature")
# Summaries (v6): their sums per group, then their duration buckets (JSON, merged here).
_SUMMARY_GROUPS_SQL = f"""
SELECT service, feature, TOTAL(requests), TOTAL(launches), TOTAL(h2d_bytes + d2h_bytes + d2d_bytes + other_bytes),
       TOTAL(nccl_calls), TOTAL(nccl_bytes), TOTAL(gpu_seconds), TOTAL(cost)
FROM request_summaries {_FILTER} GROUP BY service, feature"""
_SUMMARY_BUCKETS_SQL = f"SELECT service, feature, durations FROM request_summaries {_FILTER}"
_GROUP_SORTED_SQL = ("SELECT duration_ns FROM requests INDEXED BY requests_latency"
                     " WHERE service = ? AND feature = ? AND ts >= ? ORDER BY duration_ns")
_SUMMARY_CURRENCY_SQL = _CURRENCY_SQL.replace("FROM requests", "FROM request_summaries")
_SUMMARY_CHUNKS_SQL = f"SELECT feature, TOTAL(chunks), TOTAL(requests) FROM request_summaries {_FILTER} GROUP BY feature"
_SUMMARY_TIME_SQL = (f"SELECT service, feature, TOTAL(split_requests), TOTAL(time_shared), "
                     f"{', '.join(f'TOTAL({p})' for p in TIME_PARTS)} FROM request_summaries {_FILTER} "
                     f"AND split_requests > 0 GROUP BY service, feature")
PERCENTILES = (50, 95)


def _rank_offsets(n: int) -> list[int]:
    """Nearest rank: the k-th smallest of n, k = ceil(p/100 * n), as a 0-based offset."""
    return [max(1, -(-p * n // 100)) - 1 for p in PERCENTILES]


def _nth_sorted(cursor, offsets: list[int]) -> list[int]:
    """Values at ascending `offsets` of a sorted one-column cursor: one sort for all."""
    found = []
    for i, (value,) in enumerate(cursor):
        while len(found) < len(offsets) and offsets[len(found)] == i:
            found.append(value)
        if len(found) == len(offsets):
            break
    cursor.close()
    return found


def _figures(requests, launches, copy_bytes, nccl_calls, nccl_bytes, gpu_s, cost, pcts, exact=True) -> dict:
    return {"requests": requests, "summarised": 0,
            "p50_ms": pcts[0] / 1e6 if pcts else None,
            "p95_ms": pcts[1] / 1e6 if pcts else None,
            "percentiles": "exact" if exact else "buckets",
            "launches_per_request": (launches or 0) / requests if requests else 0.0,
            "copy_bytes": int(copy_bytes or 0), "nccl_calls": int(nccl_calls or 0),
            "nccl_bytes": int(nccl_bytes or 0), "exact_gpu_seconds": float(gpu_s or 0.0),
            "split_gpu_seconds": 0.0, "outside_gpu_seconds": 0.0, "cost": float(cost or 0.0)}


def _read(conn, params: dict) -> tuple[list[dict], dict, list[str]]:
    rows = {}
    summaries = has_table(conn, "request_summaries")
    # The summarised requests' duration buckets, by (service, feature) and over all of them.
    buckets, every = _summary_buckets(conn, params) if summaries else ({}, {})
    nccl = _NCCL_SUMS if "nccl_calls" in columns(conn, "requests") else "0, 0"
    for service, feature, n, *sums in conn.execute(_GROUPS_SQL.format(nccl=nccl), params).fetchall():
        pcts = [] if (service, feature) in buckets else [  # with summaries: read over both (_add_summaries)
            conn.execute(_NTH_IN_GROUP_SQL, (service, feature, params["since"], k)).fetchone()[0]
            for k in _rank_offsets(n)]
        rows[service, feature] = dict(service=service, feature=feature, **_figures(n, *sums, pcts))
    currencies = {r[0] for r in conn.execute(_CURRENCY_SQL, params)}
    if summaries:
        _add_summaries(conn, params, rows, buckets)
        currencies |= {r[0] for r in conn.execute(_SUMMARY_CURRENCY_SQL, params)}
    if has_table(conn, "window_costs"):  # a v1 store, never opened by a newer collector, has none
        for service, feature, kind, seconds, cost in conn.execute(_WINDOWS_SQL, params).fetchall():
            row = rows.get((service, feature))
            if row is None:  # time split to a feature none of whose requests are in range
                row = rows[service, feature] = dict(service=service, feature=feature,
                                                    **_figures(0, 0, 0, 0, 0, 0.0, 0.0, []))
            row["outside_gpu_seconds" if kind == "outside" else "split_gpu_seconds"] += seconds or 0.0
            row["cost"] += cost or 0.0
        currencies |= {r[0] for r in conn.execute(_WINDOW_CURRENCY_SQL, params)}
    rows = list(rows.values())
    for r in rows:  # names from the network, perhaps stored raw by an older version
        r["service"], r["feature"] = sanitize.optional(r["service"]), sanitize.optional(r["feature"])
        r["gpu_seconds"] = r["exact_gpu_seconds"] + r["split_gpu_seconds"] + r["outside_gpu_seconds"]
    n = sum(r["requests"] for r in rows)
    kept = n - sum(r["summarised"] for r in rows)
    if every:
        pcts, exact = _merged(conn.execute(_SORTED_SQL, params), every, n)
    else:
        pcts, exact = (_nth_sorted(conn.execute(_SORTED_SQL, params), _rank_offsets(kept)) if kept else []), True
    launches = sum(r["launches_per_request"] * r["requests"] for r in rows)
    totals = _figures(n, launches, *(sum(r[k] for r in rows) for k in ("copy_bytes", "nccl_calls", "nccl_bytes")),
                      0.0, 0.0, pcts, exact)
    totals["summarised"] = n - kept
    for k in ("gpu_seconds", "exact_gpu_seconds", "split_gpu_seconds", "outside_gpu_seconds", "cost"):
        totals[k] = sum(r[k] for r in rows)
    return rows, totals, sorted(sanitize.text(str(c)) for c in currencies)


def _summary_buckets(conn, params: dict) -> tuple[dict, dict]:
    """The summarised requests' duration buckets: by (service, feature), and all together."""
    by_group: dict = {}
    every: dict = {}
    for service, feature, durations in conn.execute(_SUMMARY_BUCKETS_SQL, params):
        for b, n in buckets_of(durations).items():
            group = by_group.setdefault((service, feature), {})
            group[b] = group.get(b, 0) + n
            every[b] = every.get(b, 0) + n
    return by_group, every


def _add_summaries(conn, params: dict, rows: dict, buckets: dict) -> None:
    """The summarised requests' sums into their groups' rows (made where a group has none),
    their percentiles read over rows and `buckets` (_summary_buckets)."""
    for service, feature, n, launches, copy_bytes, nccl_calls, nccl_bytes, gpu_s, cost in \
            conn.execute(_SUMMARY_GROUPS_SQL, params).fetchall():
        n = int(n)
        row = rows.get((service, feature))
        if row is None:
            row = rows[service, feature] = dict(service=service, feature=feature,
                                                **_figures(0, 0, 0, 0, 0, 0.0, 0.0, []))
        kept = row["requests"]
        row["launches_per_request"] = (row["launches_per_request"] * kept + launches) / (kept + n) if kept + n else 0.0
        row["requests"], row["summarised"] = kept + n, n
        row["copy_bytes"] += int(copy_bytes)
        row["nccl_calls"] += int(nccl_calls)
        row["nccl_bytes"] += int(nccl_bytes)
        row["exact_gpu_seconds"] += gpu_s
        row["cost"] += cost
        pcts, exact = _merged(conn.execute(_GROUP_SORTED_SQL, (service, feature, params["since"])),
                              buckets.get((service, feature), {}), kept + n)
        row.update(p50_ms=pcts[0] / 1e6 if pcts else None, p95_ms=pcts[1] / 1e6 if pcts else None,
                   percentiles="exact" if exact else "buckets")


def _merged(cursor, buckets: dict, n: int) -> tuple[list[int], bool]:
    """Nearest-rank percentiles of n requests: the rows' sorted durations (`cursor`) and the
    summarised ones' `buckets`; exact when no rank fell among summarised requests."""
    exact_values = [v for v, in cursor]
    found = [percentile(exact_values, buckets, k + 1) for k in _rank_offsets(n)] if n else []
    return [v for v, _ in found], all(e for _, e in found)


def build_report(conn, since_ns: Optional[int] = None, service: Optional[str] = None,
                 now: Optional[datetime] = None) -> dict:
    """The report object documented above, read in one transaction (one snapshot)."""
    params = {"since": since_ns if since_ns is not None else -(2 ** 63), "service": service}
    conn.execute("BEGIN")
    try:
        rows, totals, currencies = _read(conn, params)
        kept = columns(conn, "requests")
        summaries = has_table(conn, "request_summaries")
        chunks = _chunks(conn, params, summaries) if "chunks" in kept else {}
        times = conn.execute(_TIME_SQL, params).fetchall() if "on_cpu" in kept else []
        if summaries:
            times = _merge_groups(times + conn.execute(_SUMMARY_TIME_SQL, params).fetchall())
    finally:
        conn.execute("COMMIT")
    share_of = "cost" if totals["cost"] > 0 else "gpu_seconds" if totals["gpu_seconds"] > 0 else "requests"
    whole = totals[share_of]
    for r in rows:
        r["share"] = r[share_of] / whole if whole else 0.0
    totals["share"] = 1.0 if whole else 0.0
    rows.sort(key=lambda r: (-r["cost"], -r["gpu_seconds"], -r["requests"], r["service"],
                             r["feature"] is None, r["feature"] or ""))
    return {"since": iso_utc(since_ns), "service": service,
            "generated_at": (now or datetime.now(timezone.utc)).isoformat(timespec="seconds").replace("+00:00", "Z"),
            "currency": currencies[0] if len(currencies) == 1 else ("mixed" if currencies else None),
            "share_of": share_of, "rows": [{k: r[k] for k in ROW_FIELDS} for r in rows],
            "totals": {k: totals[k] for k in TOTAL_FIELDS}, "per_chunk": _per_chunk(rows, chunks),
            "time_split": _time_split(times)}


def _chunks(conn, params: dict, summaries: bool) -> dict:
    """feature -> its response chunks, for features whose responses stream (more chunks than
    requests), over rows and summaries."""
    sums = {f: [c, n] for f, c, n in conn.execute(_CHUNKS_SQL, params)}
    for f, c, n in conn.execute(_SUMMARY_CHUNKS_SQL, params) if summaries else ():
        got = sums.setdefault(f, [0, 0])
        got[0] += c
        got[1] += n
    return {f: c for f, (c, n) in sums.items() if c > n}


def _merge_groups(groups: list) -> list:
    """(service, feature, *sums) rows of both tables, summed per (service, feature)."""
    out: dict = {}
    for service, feature, *sums in groups:
        got = out.get((service, feature))
        out[service, feature] = sums if got is None else [a + b for a, b in zip(got, sums)]
    return [(service, feature, *sums) for (service, feature), sums in out.items()]


def _time_split(groups: list) -> list[dict]:
    """Mean time split per (service, feature) (the report's docstring)."""
    out = []
    for service, feature, n, shared, *sums in groups:
        n = int(n)
        out.append({"service": sanitize.optional(service), "feature": sanitize.optional(feature), "requests": n,
                    "shared": int(shared), **{f"{p}_ms": s / n * 1e3 for p, s in zip(TIME_PARTS, sums)}})
    return sorted(out, key=lambda t: (-sum(t[f"{p}_ms"] for p in TIME_PARTS) * t["requests"], t["service"] or "",
                                      t["feature"] or ""))


def _per_chunk(rows: list[dict], chunks: dict) -> list[dict]:
    """Cost per streamed response chunk, by feature (the report's docstring)."""
    out = []
    for feature, n in chunks.items():
        mine = [r for r in rows if r["feature"] == sanitize.optional(feature)]
        seconds = sum(r["exact_gpu_seconds"] + r["split_gpu_seconds"] for r in mine)
        cost = sum(r["cost"] for r in mine)
        out.append({"feature": sanitize.optional(feature), "chunks": int(n), "gpu_seconds": seconds,
                    "gpu_seconds_per_chunk": seconds / n, "cost_per_chunk": cost / n})
    return sorted(out, key=lambda c: (-c["cost_per_chunk"], -c["gpu_seconds_per_chunk"], c["feature"] or ""))


def to_json(report: dict) -> str:
    return json.dumps(report, indent=2)
