"""HTTP/2 multiplexed on one connection at the stream counts gateways and gRPC clients
use (1, 8, 32, 128 at once), through the real probes: hypercorn (PyPI) over h2c, each
stream's calls encoding its id, and the id also sent as `x-req-id`, exported by the
collector (`--export-header x-req-id`), so each span names its own request and a swap
between two streams fails. Every stream sleeps 20 ms between its first and second
launch, so all of them are open together (asserted). At 32 streams one read already
carries more frames than the probe's 1 KiB copy: the kernel's frame walk
(bpf/h2_walk.c) must hand over every frame header and header block."""
from __future__ import annotations

import sys
import time

import pytest

from tests.harness import TARGETS, Target, children_of, module_collector, server_spans
from tests.bpf.test_http2 import ROLLUP, _rid
from tests.support.h2_client import h2_get_all

LAUNCHES = 3
CALLS = LAUNCHES + 1  # and one cudaMemcpy
WINDOW_OUTSIDE = "GPU work outside requests"


@pytest.fixture(scope="module")
def h2_service():
    with module_collector("--export-header", "x-req-id") as collector:
        t = Target([sys.executable, str(TARGETS / "h2_server.py"), "0"])
        try:
            collector.wait_traced(t.pid)
            t.go_raw()
            assert t.log.wait_for("serving", 20)
            time.sleep(1)  # hypercorn listens once its loop runs
            yield collector, t
        finally:
            t.stop()


def _req_id(span) -> int:
    (value,) = span.attributes["http.request.header.x-req-id"]
    return int(value)


@pytest.mark.parametrize("streams", [1, 8, 32, 128])
def test_every_stream_has_its_span_and_exactly_its_calls(h2_service, streams):
    collector, t = h2_service
    receiver = collector.receiver
    base = {1: 1000, 8: 2000, 32: 3000, 128: 4000}[streams]
    ids = list(range(base, base + streams))
    paths = [f"/infer?id={i}&launches={LAUNCHES}&pause_ms=20" for i in ids]
    got = h2_get_all(t.port, paths, timeout=60, headers=lambda p: [("x-req-id", p.split("id=")[1].split("&")[0])])
    assert sorted(status for _, status in got.values()) == [200] * streams

    def mine(spans):
        return [s for s in server_spans(spans, t.pid) if base <= _req_id(s) < base + streams]

    def calls(spans):
        return [k for k in spans if k.resource.get("process.pid") == t.pid and _rid(k) in ids
                and ROLLUP not in k.attributes]

    receiver.wait_for(lambda spans: len(mine(spans)) >= streams and len(calls(spans)) >= CALLS * streams, 60)
    spans = list(receiver.spans)
    servers = mine(spans)
    assert sorted(_req_id(s) for s in servers) == ids  # every request has one span, no more
    assert len({s.attributes["client.port"] for s in servers}) == 1  # all on one connection
    assert max(s.start_ns for s in servers) < min(s.end_ns for s in servers)  # all open together
    exact = 0
    for s in servers:
        assert s.attributes["url.path"] == "/infer" and s.attributes["http.response.status_code"] == 200
        rid = _req_id(s)
        assert f"id={rid}&" in s.attributes.get("url.query", f"id={rid}&")
        kids = [k for k in children_of(spans, s) if ROLLUP not in k.attributes]
        assert {_rid(k) for k in kids} <= {rid}, (rid, sorted({_rid(k) for k in kids}))  # never another's
        exact += len(kids) == CALLS
    by_window = {}
    for w in spans:
        if w.resource.get("process.pid") == t.pid and w.name.startswith("GPU work"):
            for k in children_of(spans, w):
                if _rid(k) in ids:
                    by_window[w.name] = by_window.get(w.name, 0) + 1
    assert WINDOW_OUTSIDE not in by_window, by_window  # a request's calls are never outside every request
    assert len(calls(spans)) == CALLS * streams  # each call once, under its span or on a window
    assert exact == streams, f"{exact} of {streams} streams with exactly their calls; windows {by_window}"
    assert collector.errors() == [], collector.errors()
    assert not [l for l in collector.log.lines if "h2_walk did not load" in l or "dropping HTTP/2" in l]
