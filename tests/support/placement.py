"""Where a batch of requests' CUDA calls went, from the spans a receiver got: each
request's span identified by the id it names itself (an exported header), each call by
the id it encodes. Shared by the multiplexed tests (HTTP/2, gRPC), so that a swap
between two requests, a lost span or a call outside every request fails them alike."""
from __future__ import annotations

from dataclasses import dataclass, field

from tests.harness import server_spans

ROLLUP = "gpu.rollup.count"
WINDOW_PREFIX = "GPU work"
OUTSIDE = "GPU work outside requests"


def max_overlap(spans: list) -> int:
    """The most of `spans` open at one instant (requests that overlapped: 2 or more)."""
    edges = sorted([(s.start_ns, 1) for s in spans] + [(s.end_ns, -1) for s in spans])
    open_, most = 0, 0
    for _, d in edges:
        open_ += d
        most = max(most, open_)
    return most


def header_id(span, header: str = "x-req-id") -> int:
    """The request id a server span names: its exported `header` (one value)."""
    (value,) = span.attributes[f"http.request.header.{header}"]
    return int(value)


@dataclass
class Placement:
    servers: list                     # the batch's server spans
    exact: int = 0                    # requests with exactly their calls under their span
    wrong: list = field(default_factory=list)   # (request id, an id its span's children encode)
    windows: dict = field(default_factory=dict)  # window name -> calls of the batch it holds
    own: int = 0                      # calls under their own request's span

    @property
    def placed(self) -> int:
        return self.own + sum(self.windows.values())


def place(spans, pid: int, ids: list, rid_of, calls_per_request: int, since_ns: int) -> Placement:
    """`rid_of(call span)`: the id a call encodes (None: not one of ours). Windows count
    their calls of the batch one by one, and their rollup children (whose calls no longer
    say their id) by count, when they began at `since_ns` or later."""
    wanted = set(ids)
    mine = [s for s in spans if s.resource.get("process.pid") == pid]  # the process's spans: its resource
    kids_of: dict = {}
    for s in mine:
        kids_of.setdefault((s.trace_id, s.parent_span_id), []).append(s)
    p = Placement([s for s in server_spans(mine, pid) if header_id(s) in wanted])
    for s in p.servers:
        rid = header_id(s)
        kids = [k for k in kids_of.get((s.trace_id, s.span_id), ()) if ROLLUP not in k.attributes]
        p.wrong += [(rid, r) for r in {rid_of(k) for k in kids} if r != rid]
        own = sum(1 for k in kids if rid_of(k) == rid)
        p.own += own
        p.exact += own == calls_per_request == len(kids)
    for w in mine:
        if not w.name.startswith(WINDOW_PREFIX) or w.start_ns < since_ns:
            continue
        n = 0
        for k in kids_of.get((w.trace_id, w.span_id), ()):
            n += k.attributes[ROLLUP] if ROLLUP in k.attributes else rid_of(k) in wanted
        if n:
            p.windows[w.name] = p.windows.get(w.name, 0) + n
    return p
