"""gRPC through the real probes: a real grpcio server (tests/bpf/targets/grpc_server.py:
the thread-pool server, and grpc.aio) whose handlers call the real libcudart with the
RPC's id in every call, and a real grpcio client at 1 and 8 concurrent clients. One
server span per RPC named `{service}/{method}` with rpc.* attributes and the gRPC status
from the trailers; CUDA children exact where the attribution rules are exact (one RPC
open: `process` on a pool thread, `task` for an aio task bound by its write; several, on
the pool server: `task` through the pool thread that wrote its RPC's frames alone,
pipeline/handlers.py), else counted ambiguous, never under a wrong RPC: each span names
its RPC (its `x-req-id` metadata, exported), and every child must encode that id."""
from __future__ import annotations

import sys
import time
from concurrent.futures import ThreadPoolExecutor

import grpc
import pytest

from tests.harness import TARGETS, Target, children_of, server_spans
from tests.support.placement import header_id

SERVICE = "demo.Inference"
ROLLUP = "gpu.rollup.count"


def _rid(span) -> int | None:
    a = span.attributes
    if span.name == "cudaLaunchKernel":
        return (a.get("gpu.grid") or [None])[0]
    if span.name == "cudaMemcpy":
        return a.get("gpu.memcpy.bytes")
    return None


class Client:
    """One channel per concurrent client. grpcio's global subchannel pool puts every
    channel to the same target on one HTTP/2 connection (measured: one accept for 8
    clients), so concurrent RPCs are multiplexed streams of that connection."""

    def __init__(self, port: int) -> None:
        self.channel = grpc.insecure_channel(f"127.0.0.1:{port}")
        self.predict = self.channel.unary_unary(f"/{SERVICE}/Predict")
        self.stream = self.channel.unary_stream(f"/{SERVICE}/Stream")
        self.fail = self.channel.unary_unary(f"/{SERVICE}/Fail")

    def call(self, kind: str, rid: int):
        body, meta = str(rid).encode(), (("x-req-id", str(rid)),)  # the span names its RPC by it
        if kind == "Predict":
            return self.predict(body, timeout=20, metadata=meta)
        if kind == "Stream":
            return list(self.stream(body, timeout=20, metadata=meta))
        try:
            self.fail(body, timeout=20, metadata=meta)
        except grpc.RpcError as e:
            return e.code()


@pytest.fixture(params=["pool", "aio"])
def grpc_target(request, start_collector, targets):
    """grpcio's thread-pool server, or grpc.aio (handlers as tasks on one loop)."""
    collector = start_collector("--export-header", "x-req-id")
    t = Target([sys.executable, str(TARGETS / "grpc_server.py"), "0", *(["--aio"] if request.param == "aio" else [])])
    t.kind = request.param
    targets.append(t)
    collector.wait_traced(t.pid)
    t.go_raw()
    assert t.log.wait_for("serving", 20)
    return collector, t


def _wait_spans(receiver, pid: int, n: int, timeout: float = 40) -> list:
    receiver.wait_for(lambda spans: len(server_spans(spans, pid)) >= n, timeout)
    time.sleep(1)  # children and windows exported in the same flush, or just after
    return list(receiver.spans)


@pytest.mark.parametrize("concurrency", [1, 8])
def test_grpc_rpcs_get_one_span_each_with_rpc_attributes_and_own_calls(grpc_target, receiver, concurrency):
    _, t = grpc_target
    clients = [Client(t.port) for _ in range(concurrency)]
    plan = [(kind, 10 + i) for i, kind in enumerate(["Predict", "Stream", "Fail"] * 8)]  # 24 RPCs, ids 10..33
    with ThreadPoolExecutor(concurrency) as pool:
        results = list(pool.map(lambda job: clients[job[1] % concurrency].call(*job), plan))
    assert results.count(b"ok") == 8 and results.count(grpc.StatusCode.INTERNAL) == 8
    for c in clients:
        c.channel.close()
    expected = {"Predict": 3, "Stream": 4, "Fail": 1}  # calls: 2 launches + memcpy, 3 + memcpy, 1 launch
    ids, total = {rid for _, rid in plan}, sum(expected[kind] for kind, _ in plan)
    receiver.wait_for(lambda got: sum(1 for k in got if k.resource.get("process.pid") == t.pid
                                      and _rid(k) in ids) >= total, 40)
    spans = _wait_spans(receiver, t.pid, len(plan))
    servers = server_spans(spans, t.pid)
    by_id = {}
    for s in servers:
        assert s.name in (f"{SERVICE}/Predict", f"{SERVICE}/Stream", f"{SERVICE}/Fail"), s.name
        a = s.attributes
        assert (a["rpc.system"], a["rpc.service"], a["http.route"]) == ("grpc", SERVICE, "/" + s.name)
        assert a["rpc.method"] == s.name.split("/")[1]
        assert a["network.protocol.version"] == "2"
        want_status = 13 if a["rpc.method"] == "Fail" else 0
        assert a["rpc.grpc.status_code"] == want_status, s.name
        assert (s.status_code == 2) == (want_status == 13)  # 2: STATUS_CODE_ERROR
        kids = [k for k in children_of(spans, s) if ROLLUP not in k.attributes]
        rids = {_rid(k) for k in kids}
        assert rids <= {header_id(s)}, f"{s.name} {header_id(s)}: calls of {rids}"  # never a wrong RPC's call
        if rids:
            by_id.setdefault(rids.pop(), []).append((s, kids))
    assert len(servers) == len(plan), f"{len(servers)} server spans for {len(plan)} RPCs"
    exact = ambiguous = 0
    exact_by_kind = dict.fromkeys(expected, 0)
    for kind, rid in plan:
        got = by_id.get(rid, [])
        assert len(got) <= 1, f"rpc {rid}: calls under {len(got)} spans"
        if got:
            s, kids = got[0]
            assert s.name == f"{SERVICE}/{kind}"
            if len(kids) == expected[kind]:
                exact += 1
                exact_by_kind[kind] += 1
            assert all(k.attributes["otel_gpu.attribution"] in ("process", "thread", "task") for k in kids)
        ambiguous += 0 if got and len(got[0][1]) == expected[kind] else 1
    # Every call is somewhere, counted: under its own RPC, or on an ambiguous window (or,
    # seen once in six runs at 8 clients and not explained yet, an `outside` one: printed).
    windows = [w for w in spans if w.name.startswith("GPU work") and w.attributes.get("process.pid") == t.pid]
    placed, outside = {}, 0
    for parent in [s for s, _ in sum(by_id.values(), [])] + windows:
        for k in children_of(spans, parent):
            if ROLLUP not in k.attributes and (rid := _rid(k)) in ids:
                placed[rid] = placed.get(rid, 0) + 1
                outside += k.attributes.get("otel_gpu.attribution") == "outside"
    for kind, rid in plan:
        if placed.get(rid, 0) != expected[kind]:
            by_span = {x.span_id: x for x in spans}
            where = [(k.name, k.attributes.get("otel_gpu.attribution"), getattr(by_span.get(k.parent_span_id), "name", None))
                     for k in spans if _rid(k) == rid and k.resource.get("process.pid") == t.pid]
            pytest.fail(f"rpc {rid} ({kind}): {placed.get(rid, 0)} calls placed; all its calls: {where}")
    print(f"grpc {t.kind} concurrency {concurrency}: {exact} of {len(plan)} RPCs exact {exact_by_kind}, {ambiguous} counted ambiguous, "
          f"{outside} calls of open RPCs on an outside window")
    if concurrency == 1:  # one RPC open at a time: its pool thread's calls (process), its task's (bound)
        assert exact == len(plan), f"{exact} of {len(plan)} RPCs with exactly their calls"
    elif t.kind == "pool":  # exact where the pool thread wrote its RPC's frames alone (pipeline/handlers.py):
        # 10-22 of 24 measured, fewer on a loaded machine where C-core's threads write more; 0-2 before that rule
        assert exact >= len(plan) // 4, f"{exact} of {len(plan)} RPCs with exactly their calls {exact_by_kind}"
    # grpc.aio with several RPCs open: each RPC's task writes through C-core, whose combiner
    # writes whatever frames are queued, so no write binds a task; calls counted ambiguous
    # (1-2 of 24 exact measured: moments with one RPC open), never under a wrong RPC (above).
