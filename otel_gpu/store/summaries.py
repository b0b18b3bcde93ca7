"""Requests the store keeps as sums, not rows (#45's decision): an unsampled request that
did not end in an error is added to its route's summary for its interval (INTERVAL_S, by
the request's start), with its duration in a log-scale bucket (DurationBuckets). Sampled
requests and every request that ends in an error keep their rows and spans.

A summary is written when it changes, at most every FLUSH_S, as one row of
`request_summaries` (schema.py), the same row again while its interval is open (by rowid).
A cost settled after its request was summarised (pipeline/cost.py) is added to the
summary it went to, written or not."""
from __future__ import annotations

import json
import math
from bisect import bisect_right
from typing import Optional

INTERVAL_S = 10          # a summary's span of request start times
FLUSH_S = 1.0            # dirty summaries are written at most this often
MAX_PENDING_COSTS = 100_000  # summarised requests whose cost has not settled yet; past it, the oldest is let go
INT64_MAX = 2**63 - 1

# The columns a summary sums, in request_summaries' order; `split_requests` and the four time
# parts sum over the requests whose time was split (their columns are NULL otherwise).
SUMMED = ("launches", "h2d_bytes", "d2h_bytes", "d2d_bytes", "other_bytes", "sync_ns", "gpu_seconds", "cost",
          "ambiguous", "nccl_calls", "nccl_bytes", "graph_kernels", "chunks")
TIME_PARTS = ("on_cpu", "cpu_wait", "gpu_sync", "blocked")  # pipeline/time_split.py PARTS, the store's columns
KEY = ("service", "k8s_namespace", "k8s_pod", "feature", "method", "route", "status_code")
COLUMNS = ("ts",) + KEY + ("currency", "requests", "duration_ns", "durations") + SUMMED + \
    ("split_requests",) + TIME_PARTS + ("time_shared",)


class DurationBuckets:
    """Bucket b holds durations in (bound(b-1), bound(b)], bound(b) = 1 µs x 2^(b/8): each
    bound 9 % above the last, so a percentile read from buckets is within 9 % of the truth."""
    STEPS_PER_DOUBLING = 8
    FIRST_NS = 1000

    @classmethod
    def bound(cls, b: int) -> int:
        return math.ceil(cls.FIRST_NS * 2 ** (b / cls.STEPS_PER_DOUBLING))

    @classmethod
    def of(cls, ns: int) -> int:
        if ns <= cls.FIRST_NS:
            return 0
        b = math.ceil(cls.STEPS_PER_DOUBLING * math.log2(ns / cls.FIRST_NS))
        while cls.bound(b) < ns:  # the float log, corrected to the integer bounds
            b += 1
        while b > 0 and cls.bound(b - 1) >= ns:
            b -= 1
        return b


def percentile(exact: list[int], buckets: dict[int, int], rank: int) -> tuple[Optional[int], bool]:
    """The `rank`-th smallest (1-based) of the durations `exact` (sorted) and those counted
    in `buckets` (bucket -> count): (value, exact?). Where the rank falls in a bucket holding
    summarised requests, the value is that bucket's upper bound; else the row's own value."""
    if rank < 1 or rank > len(exact) + sum(buckets.values()):
        return None, True
    seen, lo = 0, 0
    for b in sorted(set(buckets) | {DurationBuckets.of(v) for v in exact}):
        hi = bisect_right(exact, DurationBuckets.bound(b), lo)
        summarised = buckets.get(b, 0)
        if seen + (hi - lo) + summarised >= rank:
            if summarised:
                return DurationBuckets.bound(b), False
            return exact[lo + rank - seen - 1], True
        seen += hi - lo + summarised
        lo = hi
    return None, True  # not reached: the counts add up


def buckets_of(text: str) -> dict[int, int]:
    """A row's `durations` (JSON {bucket: count}) as a dict."""
    return {int(b): n for b, n in json.loads(text).items()}


class Summary:
    """One (interval, route) summary: its key, sums, duration buckets and rowid once written."""
    __slots__ = ("ts", "key", "currency", "requests", "duration_ns", "buckets", "sums", "split_requests",
                 "times", "time_shared", "rowid", "dirty")

    def __init__(self, ts: int, key: tuple) -> None:
        self.ts, self.key, self.currency = ts, key, None
        self.requests = self.duration_ns = self.split_requests = self.time_shared = 0
        self.buckets: dict[int, int] = {}
        self.sums = [0] * len(SUMMED)
        self.times = [0.0] * len(TIME_PARTS)
        self.rowid: Optional[int] = None
        self.dirty = False  # changed since written: in Summaries.dirty

    def add(self, row: dict) -> None:
        self.requests += 1
        self.duration_ns += row["duration_ns"]
        b = DurationBuckets.of(row["duration_ns"])
        self.buckets[b] = self.buckets.get(b, 0) + 1
        for i, col in enumerate(SUMMED):
            self.sums[i] += row[col] or 0
        if row["on_cpu"] is not None:
            self.split_requests += 1
            self.times = [t + (row[p] or 0.0) for t, p in zip(self.times, TIME_PARTS)]
        self.time_shared += bool(row["time_shared"])
        self.currency = self.currency or row["currency"]

    def add_cost(self, gpu_seconds: float, cost: float, currency: Optional[str]) -> None:
        self.sums[SUMMED.index("gpu_seconds")] += gpu_seconds or 0.0
        self.sums[SUMMED.index("cost")] += cost or 0.0
        self.currency = self.currency or currency

    def values(self) -> tuple:
        """Its row, in COLUMNS order (integer sums held within int64, as the spans clamp)."""
        sums = [min(v, INT64_MAX) if type(v) is int else v for v in self.sums]
        return (self.ts, *self.key, self.currency, self.requests, min(self.duration_ns, INT64_MAX),
                json.dumps(self.buckets, separators=(",", ":")), *sums, self.split_requests, *self.times,
                self.time_shared)


class Summaries:
    """The summaries of the intervals still open, and those a pending cost may still reach."""

    def __init__(self, interval_s: float = INTERVAL_S) -> None:
        self.interval_ns = int(interval_s * 1e9)
        self.open: dict[tuple, Summary] = {}        # (interval start, key) -> its summary
        self.pending: dict[str, Summary] = {}       # span id -> the summary of a request whose cost is pending
        self.dirty: list[Summary] = []

    def add(self, row: dict, cost_pending: bool) -> bool:
        """`row`: a request's columns (exporter.request_row, by name). False when the oldest
        pending cost was let go to make room (its cost will not reach the store)."""
        ts = row["ts"] - row["ts"] % self.interval_ns
        key = tuple(row[k] for k in KEY)
        s = self.open.get((ts, key))
        if s is None:
            s = self.open[ts, key] = Summary(ts, key)
        self._changed(s)
        s.add(row)
        room = True
        if cost_pending:
            if len(self.pending) >= MAX_PENDING_COSTS:
                self.pending.pop(next(iter(self.pending)))
                room = False
            self.pending[row["span_id"]] = s
        return room

    def settle_cost(self, span_id: str, gpu_seconds: float, cost: float, currency: Optional[str]) -> bool:
        """A summarised request's cost: False when no summary holds that request."""
        s = self.pending.pop(span_id, None)
        if s is None:
            return False
        self._changed(s)
        s.add_cost(gpu_seconds, cost, currency)
        return True

    def take_dirty(self, now_ns: int) -> list[Summary]:
        """The summaries to write now; the intervals over by one more interval are let go
        (a request of theirs finishing later starts a new summary row)."""
        out, self.dirty = self.dirty, []
        for s in out:
            s.dirty = False
        for k in [k for k, s in self.open.items() if s.ts + 2 * self.interval_ns <= now_ns]:
            del self.open[k]
        return out

    def failed(self, taken: list[Summary]) -> None:
        """Their write failed: tried again at the next flush."""
        for s in taken:
            self._changed(s)

    def _changed(self, s: Summary) -> None:
        if not s.dirty:
            s.dirty = True
            self.dirty.append(s)
