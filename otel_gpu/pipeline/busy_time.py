"""Busy-time arithmetic of the cost stage (pipeline/cost.py): stretches of time shared among
owners, host windows (one interval each) or the device's intervals (device-clock mode), each
stretch divided evenly among those covering it, and what is left once others took theirs."""
from __future__ import annotations


def remainder_seconds(window: tuple[int, int], taken, peers) -> float:
    """Seconds of `window` that no `taken` interval covers, each stretch divided by
    1 + the number of `peers` covering it. One sweep over the sorted edges."""
    start, end = window
    if end <= start:
        return 0.0
    edges = [(start, 0, 0), (end, 0, 0)]  # (time, 0 taken / 1 peer, change in count)
    for kind, intervals in ((0, taken), (1, peers)):
        for s, e in intervals:
            if s < end and e > start and e > s:
                edges += [(max(s, start), kind, +1), (min(e, end), kind, -1)]
    edges.sort()
    total, covering, prev = 0.0, [0, 0], start
    for t, kind, delta in edges:
        if t > prev:
            if not covering[0]:
                total += (t - prev) / (1 + covering[1])
            prev = t
        covering[kind] += delta
    return total / 1e9


def split_seconds(window: tuple[int, int], others: list[tuple[int, int]]) -> float:
    """Seconds of `window` with each stretch divided by how many windows cover it.
    One sweep over the others' starts and ends, each sorted on its own (numbers sort
    faster than edge tuples, and edges at one instant bound no stretch between them):
    O(n log n) in the number of windows. It runs once per request, against every window
    that overlaps it (32 requests in flight: 32 each); remainder_seconds is the same sweep
    with taken intervals, kept apart."""
    start, end = window
    if end <= start:
        return 0.0
    starts, ends = [], []
    for s, e in others:
        if s < end and e > start and e > s:
            starts.append(s if s > start else start)
            ends.append(e if e < end else end)
    if not starts:
        return (end - start) / 1e9
    starts.sort()
    ends.sort()
    total, covering, prev, i, j, n = 0.0, 0, start, 0, 0, len(starts)
    while j < n:  # every end comes at or after its start: the ends finish last
        if i < n and starts[i] < ends[j]:
            t, delta = starts[i], 1
            i += 1
        else:
            t, delta = ends[j], -1
            j += 1
        if t > prev:
            total += (t - prev) / (1 + covering)
            prev = t
        covering += delta
    return (total + (end - prev)) / 1e9  # the rest, if any, is its own


def union(intervals) -> list[tuple[int, int]]:
    """Intervals merged where they overlap or touch, sorted."""
    out: list[list[int]] = []
    for s, e in sorted(intervals):
        if out and s <= out[-1][1]:
            out[-1][1] = max(out[-1][1], e)
        elif e > s:
            out.append([s, e])
    return [(s, e) for s, e in out]


def shared_seconds(mine, taken=(), peers=()) -> float:
    """Device-clock mode: seconds of the union of `mine` (an owner's device intervals) that no
    `taken` interval covers (an owner charged before it: a request, for a window), each
    stretch divided by 1 + how many `peers` (others' intervals, one tuple each) cover it: the
    device ran their work too meanwhile. remainder_seconds' rule, for intervals the device timed."""
    edges = [(s, 0, +1) for s, _ in union(mine)] + [(e, 0, -1) for _, e in union(mine)]
    edges += [(s, 1, +1) for s, _ in union(taken)] + [(e, 1, -1) for _, e in union(taken)]
    for p in peers:
        spans = union(p)
        edges += [(s, 2, +1) for s, _ in spans] + [(e, 2, -1) for _, e in spans]
    edges.sort()
    total, covering, prev = 0.0, [0, 0, 0], None
    for t, kind, delta in edges:
        if prev is not None and t > prev and covering[0] and not covering[1]:
            total += (t - prev) / (1 + covering[2])
        prev = t
        covering[kind] += delta
    return total / 1e9


def split_by_overlap(seconds: float, busy: tuple[int, int], intervals: dict) -> dict:
    """`seconds` among the keys of `intervals` in proportion to how long each interval
    overlaps `busy` (None, not known: all of it); evenly when none does."""
    if not intervals:
        return {}
    s, e = busy
    weights = {k: e - s if iv is None else max(0, min(iv[1], e) - max(iv[0], s)) for k, iv in intervals.items()}
    total = sum(weights.values())
    if total <= 0:
        return {k: seconds / len(intervals) for k in intervals}
    return {k: seconds * w / total for k, w in weights.items()}
