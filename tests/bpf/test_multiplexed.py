"""Multiplexed servers through the real probes, at the stream counts gateways and gRPC
clients use: 1, 8, 32 and 128 requests at once on ONE connection, to hypercorn (PyPI)
over h2c (a plain ASGI app, FastAPI `async def`, FastAPI `def`), Go's net/http over
h2c (built by the tests), and grpcio (thread-pool server, grpc.aio). Each request's
calls encode its id, and each request carries the id as `x-req-id` (a header, or gRPC
metadata) that the collector exports, so every span names its own request and a swap
between two requests fails. Every HTTP/2 stream sleeps 10 ms between its launches
(tests/bpf/targets/h2_apps.py), every RPC 10 ms after each launch (--pause-ms): at least
half of a batch are open at one instant (asserted, from their spans; with 1 ms, 16 pool
workers finished RPCs faster than a loaded 2-core client issued 128 of them).

Asserted for every server and count: every request has exactly one span; no call is
under another request's span or outside every request (a call no rule can prove goes to
the ambiguous window, counted); every call is placed once. The exactness reached (calls
under their own span) is printed as the README's support table gives it, and asserted
equal to the requests where the rules prove it (SERVERS)."""
from __future__ import annotations

import sys
import time

import grpc
import pytest

from tests.bpf.targets import h2_shape  # the servers' own modules load libcudart: not imported here
from tests.bpf.test_grpc import SERVICE, _rid as grpc_rid
from tests.harness import TARGETS, Target, module_collector
from tests.support.h2_client import h2_get_all
from tests.support.placement import OUTSIDE, header_id, place

STREAMS = [1, 8, 32, 128]
GRPC_PAUSE = ["--pause-ms", "10"]  # each RPC stays open while the client issues the rest
# server -> (argv after the interpreter or binary, calls per request, the id a call encodes,
#            the stream counts at which every request is exact: where the rules prove it)
SERVERS = {
    "hypercorn-asgi": (["asgi"], h2_shape.CALLS, h2_shape.rid_of, STREAMS),  # each stream's task binds
    "hypercorn-fastapi-async": (["fastapi-async"], h2_shape.CALLS, h2_shape.rid_of, STREAMS),
    "hypercorn-fastapi-def": (["fastapi-def"], h2_shape.CALLS, h2_shape.rid_of, STREAMS),  # a copy of its context
    "go-h2c": ([], h2_shape.CALLS, h2_shape.rid_of, STREAMS),  # each stream's handler goroutine binds (go_h2.py)
    "go-h2c-stripped": ([], h2_shape.CALLS, h2_shape.rid_of, STREAMS),  # its functions found in .gopclntab
    "grpc-pool": (GRPC_PAUSE, 3, grpc_rid, [1]),  # one RPC open: process.one; more: where a pool thread wrote alone
    "grpc-aio": (["--aio", *GRPC_PAUSE], 3, grpc_rid, [1]),  # one RPC open: its task binds
}


def _start(server: str) -> Target:
    args = SERVERS[server][0]
    if server.startswith("hypercorn"):
        return Target([sys.executable, str(TARGETS / "h2_apps.py"), *args, "0"])
    if server.startswith("grpc"):
        return Target([sys.executable, str(TARGETS / "grpc_server.py"), "0", *args])
    from otel_gpu.demo.cuda_work import find_cudart
    from tests.bpf.targets.go.build import build, toolchains
    newest = max(toolchains(), key=lambda v: tuple(map(int, v.split("."))), default=None)
    if newest is None or tuple(map(int, newest.split(".")))[:2] < (1, 24):
        pytest.skip("no Go 1.24+ under .go/ (scripts/setup.sh installs it): h2c needs http.Protocols")
    stripped = server.endswith("-stripped")
    return Target([str(build("h2c_server.go", toolchains()[newest], stripped)), find_cudart(), "0"])


@pytest.fixture(scope="module")
def collector():
    """One collector for every server (each test checks its own target's spans)."""
    with module_collector("--export-header", "x-req-id", "--flush-interval", "1") as c:  # windows each second
        yield c


@pytest.fixture(scope="module", params=list(SERVERS))
def service(request, collector):
    t = _start(request.param)
    t.server = request.param
    try:
        collector.wait_traced(t.pid)
        t.go_raw()
        assert t.log.wait_for("serving", 20)
        time.sleep(1)  # hypercorn listens once its loop runs
        yield collector, t
    finally:
        t.stop()
    assert collector.errors() == [], collector.errors()


def _send(t: Target, ids: list) -> None:
    if t.server.startswith("grpc"):
        with grpc.insecure_channel(f"127.0.0.1:{t.port}") as channel:
            predict = channel.unary_unary(f"/{SERVICE}/Predict")
            calls = [predict.future(str(i).encode(), timeout=60, metadata=(("x-req-id", str(i)),)) for i in ids]
            assert [c.result() for c in calls] == [b"ok"] * len(ids)
        return
    got = h2_get_all(t.port, [f"/infer?id={i}" for i in ids], timeout=60,
                     headers=lambda path: [("x-req-id", path.rsplit("=", 1)[1])])
    assert sorted(status for _, status in got.values()) == [200] * len(ids)


@pytest.mark.parametrize("streams", STREAMS)
def test_every_request_has_its_span_and_never_another_requests_calls(service, streams):
    collector, t = service
    _, calls, rid_of, exact_at = SERVERS[t.server]
    ids = list(range(1000 * (1 + STREAMS.index(streams)), 1000 * (1 + STREAMS.index(streams)) + streams))
    since = time.time_ns()
    _send(t, ids)

    def placement():
        return place(list(collector.receiver.spans), t.pid, ids, rid_of, calls, since)

    collector.receiver.wait_for(lambda _: (p := placement()) and len(p.servers) >= streams
                                and p.placed >= calls * streams, 60)
    time.sleep(0.5)  # windows flushed with, or just after, the last span
    p = placement()
    assert sorted(header_id(s) for s in p.servers) == ids  # one span each, none lost, none twice
    assert len({s.attributes["client.port"] for s in p.servers}) == 1  # one connection
    together = most_open(p.servers)
    assert together >= (streams + 1) // 2, together  # they overlapped: at least half of them open at once
    assert p.wrong == []  # never another request's call
    assert not p.windows.get(OUTSIDE), p.windows  # a request's calls are never outside every request
    assert p.placed == calls * streams, (p.own, p.windows)  # every call once
    print(f"{t.server} {streams} streams ({together} open at once): {p.exact} of {streams} exact, "
          f"{p.windows} ambiguous/shared")
    if streams in exact_at:
        assert p.exact == streams, (p.exact, p.windows)
    assert not [line for line in collector.log.lines if "dropping HTTP/2" in line or "h2_walk did not load" in line]


def most_open(spans) -> int:
    """The most of `spans` open at one instant."""
    edges = sorted([(s.start_ns, 1) for s in spans] + [(s.end_ns, -1) for s in spans])
    most = now = 0
    for _, step in edges:
        now += step
        most = max(most, now)
    return most


def test_frames_cut_anywhere_by_the_reads_are_joined(service):
    """The client's bytes dribbled 7 at a time: the server's reads cut the preface,
    frame headers and header blocks anywhere, and the kernel's walk carries a cut frame
    header over to the next read (bpf/h2_walk.c h2_side.part). Every request is still
    followed, exactly (hypercorn's ASGI app: its streams' tasks bind)."""
    collector, t = service
    if t.server != "hypercorn-asgi":
        pytest.skip("one server is enough: the walk is the same for all")
    ids = list(range(9000, 9008))
    since = time.time_ns()
    got = h2_get_all(t.port, [f"/infer?id={i}" for i in ids], timeout=60, dribble=7,
                     headers=lambda path: [("x-req-id", path.rsplit("=", 1)[1])])
    assert sorted(status for _, status in got.values()) == [200] * len(ids)
    calls, rid_of = SERVERS[t.server][1], SERVERS[t.server][2]

    def placement():
        return place(list(collector.receiver.spans), t.pid, ids, rid_of, calls, since)

    collector.receiver.wait_for(lambda _: len(placement().servers) >= len(ids), 60)
    time.sleep(0.5)
    p = placement()
    assert sorted(header_id(s) for s in p.servers) == ids and p.wrong == [] and p.exact == len(ids), p
