"""HTTP/2 cleartext (prior knowledge) through the real probes: hypercorn (PyPI) serving
an ASGI app whose requests make real libcudart calls encoding their id, and clients
built on the `h2` package sending several concurrent streams on one connection, and on
several connections at once. One server span per stream, with its path and status;
every stream's CUDA calls under its own span (task: hypercorn writes each stream's
response HEADERS from the stream's app task, which binds it; responses.responding_stream),
never under another stream's: each span names its request (its exported query's id), and
every child's encoded id must be that one."""
from __future__ import annotations

import sys
import time
from urllib.parse import parse_qs
from concurrent.futures import ThreadPoolExecutor

import pytest

from tests.harness import TARGETS, Target, children_of, server_spans
from tests.support.h2_client import h2_get_all

ROLLUP = "gpu.rollup.count"


def _rid(span):
    """The request id a CUDA call encodes (tests/bpf/targets/h2_server.py)."""
    if span.name == "cudaLaunchKernel":
        return (span.attributes.get("gpu.grid") or [None])[0]
    return span.attributes.get("gpu.memcpy.bytes") if span.name == "cudaMemcpy" else None


@pytest.fixture
def h2_target(start_collector, targets):
    collector = start_collector("--export-query")  # each span names its request: url.query's id
    t = Target([sys.executable, str(TARGETS / "h2_server.py"), "0"])
    targets.append(t)
    collector.wait_traced(t.pid)
    t.go_raw()
    assert t.log.wait_for("serving", 20)
    time.sleep(1)  # hypercorn listens once its loop runs
    return collector, t


def test_concurrent_streams_on_one_connection_each_get_their_span_and_calls(h2_target, receiver):
    _, t = h2_target
    ids = list(range(40, 48))
    paths = [f"/infer?id={i}&launches=3" for i in ids] + ["/missing?id=99&launches=1"]
    got = h2_get_all(t.port, paths)
    assert sorted(status for _, status in got.values()) == [200] * len(ids) + [404]
    receiver.wait_for(lambda spans: len(server_spans(spans, t.pid)) >= len(paths), 40)
    receiver.wait_for(lambda spans: sum(1 for k in spans if k.resource.get("process.pid") == t.pid
                                        and k.name in ("cudaLaunchKernel", "cudaMemcpy")) >= 4 * len(ids), 30)
    spans = list(receiver.spans)
    servers = server_spans(spans, t.pid)
    assert len(servers) == len(paths), [s.name for s in servers]
    ports = {s.attributes["client.port"] for s in servers}
    assert len(ports) == 1  # all on one connection
    by_path = {s.attributes["url.path"] + str(s.attributes.get("http.response.status_code")): s for s in servers}
    assert by_path["/missing404"].name == "GET /missing"
    for s in servers:
        a = s.attributes
        assert a["network.protocol.version"] == "2" and "rpc.system" not in a
        assert s.name in ("GET /infer", "GET /missing")
    exact = own_or_ambiguous(spans, servers, t.pid, ids)
    assert exact == len(ids), f"{exact} of {len(ids)} streams with exactly their calls"


def test_concurrent_connections_each_with_concurrent_streams(h2_target, receiver):
    """4 clients at once, each with 4 streams on its own connection: 16 requests open
    together in one process, over 4 connections."""
    _, t = h2_target
    ids = [[60 + 4 * c + i for i in range(4)] for c in range(4)]
    with ThreadPoolExecutor(len(ids)) as pool:
        got = list(pool.map(lambda mine: h2_get_all(t.port, [f"/infer?id={i}&launches=3" for i in mine]), ids))
    assert [sorted(status for _, status in g.values()) for g in got] == [[200] * 4] * 4
    flat = sum(ids, [])
    receiver.wait_for(lambda spans: len(server_spans(spans, t.pid)) >= len(flat), 40)
    receiver.wait_for(lambda spans: sum(1 for k in spans if k.resource.get("process.pid") == t.pid
                                        and k.name in ("cudaLaunchKernel", "cudaMemcpy")) >= 4 * len(flat), 30)
    spans = list(receiver.spans)
    servers = server_spans(spans, t.pid)
    assert len(servers) == len(flat) and len({s.attributes["client.port"] for s in servers}) == len(ids)
    exact = own_or_ambiguous(spans, servers, t.pid, flat)
    assert exact == len(flat), f"{exact} of {len(flat)} streams with exactly their calls"


def own_or_ambiguous(spans, servers, pid: int, ids: list, calls: int = 4) -> int:
    """Each stream's calls: under its own server span or on an ambiguous window, never
    under another stream's (/missing has none); how many streams got exactly theirs."""
    exact, own = 0, {}
    for s in servers:
        kids = [k for k in children_of(spans, s) if ROLLUP not in k.attributes]
        if s.attributes["url.path"] == "/missing":
            assert kids == []
            continue
        rids = {_rid(k) for k in kids}
        own_id = int(parse_qs(s.attributes["url.query"])["id"][0])  # the id the span itself names
        assert rids <= {own_id}, (s.name, own_id, rids)  # never another stream's calls
        if kids:
            exact += len(kids) == calls
            own[rids.pop()] = len(kids)
    # Every call is somewhere, counted: under its own stream, or on an ambiguous window.
    windows = [w for w in spans if w.name == "GPU work, ambiguous request" and w.resource.get("process.pid") == pid]
    placed = dict(own)
    for w in windows:
        for k in children_of(spans, w):
            if ROLLUP not in k.attributes and (rid := _rid(k)) in ids:
                placed[rid] = placed.get(rid, 0) + 1
    assert placed == {i: calls for i in ids}, placed
    return exact
