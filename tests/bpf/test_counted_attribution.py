"""Calls counted in the kernel (req_agg) land on their own request under real concurrency.

With --stream-budget 0 a request's calls past its first (per thread and context) are
counted in the kernel instead of streamed, as they are under a stalled consumer or past
the budget. The counts are placed where their epoch ended; a Python context's id is its
address, which the next request's copy takes once it is freed, so the copy record ends
an epoch too (bpf/maps.h epoch_submit): else a count made in the first incarnation was
settled under the second, and one request's calls hung under another's span (seen on a
GPU: 124 of 1714 FastAPI requests wrong while the consumer caught up).

Each request of tests/bpf/targets/async_servers.py makes K launches and one cudaMemcpy of
`id` bytes: under its server span the launches (one by one or in rollups) must number K
and the copy's bytes must be its id."""
from __future__ import annotations

from collections import defaultdict

import pytest

from tests.bpf.load_client import fetch_all
from tests.bpf.test_async_attribution import INTERPRETERS, request_id, wait_for_ids
from tests.harness import TARGETS, Target, server_spans

K = 3
REQUESTS = 400
ROLLUP = "gpu.rollup.count"


def _own_counts(children) -> tuple[int, int]:
    """(launches, memcpy bytes) under one server span, single calls and rollups alike."""
    launches = nbytes = 0
    for c in children:
        a = c.attributes
        if c.name.startswith("cudaLaunchKernel"):
            launches += a.get(ROLLUP, 1)
        elif c.name.startswith("cudaMemcpy"):
            nbytes += a["gpu.rollup.bytes"] if ROLLUP in a else a.get("gpu.memcpy.bytes", 0)
    return launches, nbytes


@pytest.mark.parametrize("kind", ["fastapi-def", "fastapi-async"])
def test_counted_calls_land_on_their_own_request(kind, receiver, start_collector):
    python = INTERPRETERS["py312_pyenv"][0]
    if not python.exists():
        pytest.skip(f"{python.parent.parent.name} is missing (scripts/setup.sh builds it)")
    collector = start_collector("--export-query", "--stream-budget", "0", "--stream-rate", "1000000")
    target = Target([str(python), str(TARGETS / "async_servers.py"), kind, "0"])
    try:
        collector.wait_traced(target.pid)
        target.go()
        ids = list(range(1, REQUESTS + 1))
        out = fetch_all(target.port, [f"/infer?id={i}&launches={K}" for i in ids], 8, 90)
        assert len(out.ok) == REQUESTS, out.errors[:5]
        wait_for_ids(receiver, target.pid, ids)
        spans = list(receiver.spans)
        kids = defaultdict(list)
        for s in spans:
            if s.parent_span_id:
                kids[(s.trace_id, s.parent_span_id)].append(s)
        wrong, rolled = [], 0
        for s in server_spans(spans, target.pid):
            rid = request_id(s)
            if rid is None:
                continue
            mine = kids[(s.trace_id, s.span_id)]
            rolled += sum(1 for c in mine if ROLLUP in c.attributes)
            if _own_counts(mine) != (K, rid):
                wrong.append((rid, _own_counts(mine)))
        summary = f"{kind}: {len(wrong)} of {REQUESTS} requests not exactly their own calls, rollup children {rolled}"
        print(summary)
        assert rolled > REQUESTS // 2, summary  # the counted path was taken (else this tests nothing)
        assert not wrong, f"{summary}: (id, (launches, memcpy bytes)) {wrong[:8]}"
    finally:
        target.stop()
