"""Go servers are exact under real concurrency (issue 24): a net/http server built by
the test (tests/bpf/targets/go/server.go) with the oldest and newest Go toolchains,
stripped and not, under GOMAXPROCS 1 and 4, whose handlers call the real libcudart
through cgo, each call encoding its request (grid (id, 1, 1), a copy of id bytes).
Goroutines park between calls (a 2 ms sleep), so they change OS threads: the thread
that read one request's head later runs another's goroutine.

One collector serves the module; one server process per build, with 1, 8 and 32
keep-alive clients, each request in one of three modes (the handler's own goroutine;
goroutines the handler starts and waits for; a handler locked to its OS thread):
  - zero calls under a wrong request, at every level;
  - >= 99 % of requests exactly their own calls (100 % with one client);
  - a batcher goroutine's steps (handlers queue, it launches for each, then
    synchronises) are `shared` windows, each linked to every request of its step and
    only to requests in flight, never under a server span;
  - a background goroutine's launches (grid 0, every 2 ms, for no request) are
    `outside`, never under a server span, while requests are open."""
from __future__ import annotations

import re
from collections import Counter

import pytest

from tests.bpf.load_client import fetch_all
from tests.bpf.targets.go.build import build, toolchains
from tests.bpf.test_async_attribution import ATTRIBUTION, LAUNCH, ROLLUP, Check, request_id, wait_for_ids
from tests.support.otlp_receiver import OtlpReceiver
from tests.harness import RunningCollector, Target, check_clean, children_of, serve_traced, server_spans

K = 3
LEVELS = {1: 12, 8: 48, 32: 96}  # clients -> requests (ids distinct across levels)
MODES = ("handler", "fanout", "locked")
BATCHED = 48                     # batch-mode requests, from 8 clients
STEP_RE = re.compile(r"step (\d+) ids ((?:\d+ ?)+)$")

TOOLCHAINS = toolchains()
# (Go version, stripped, GOMAXPROCS): oldest and newest, each stripped and not, each
# GOMAXPROCS on both.
OLDEST, NEWEST = (sorted(TOOLCHAINS, key=lambda v: tuple(map(int, v.split("."))))[i] for i in (0, -1)) \
    if TOOLCHAINS else ("none", "none")
BUILDS = [(OLDEST, False, 4), (OLDEST, True, 1), (NEWEST, False, 1), (NEWEST, True, 4)]
pytestmark = pytest.mark.skipif(not TOOLCHAINS, reason="no Go toolchain under .go/ (scripts/setup.sh installs them)")


@pytest.fixture(scope="module")
def traced():
    receiver = OtlpReceiver().start()
    collector = None
    try:
        collector = RunningCollector(receiver, ["--export-query", "--stream-rate", "1000000"], {})
        yield collector, receiver
        collector.stop()
        check_clean(collector)
    finally:
        if collector:
            collector.stop()
        receiver.stop()


def _server(collector, version: str, stripped: bool, procs: int, *extra: str) -> Target:
    from otel_gpu.demo.cuda_work import find_cudart
    binary = build("server.go", TOOLCHAINS[version], stripped)
    return serve_traced(collector, Target([str(binary), find_cudart(), "0", *extra], {"GOMAXPROCS": str(procs)}))


@pytest.mark.parametrize("version,stripped,procs", BUILDS,
                         ids=[f"go{v}-{'stripped' if s else 'symbols'}-gomaxprocs{p}" for v, s, p in BUILDS])
def test_each_go_request_gets_exactly_its_own_calls(traced, version, stripped, procs):
    collector, receiver = traced
    target = _server(collector, version, stripped, procs)
    try:
        line = next(l for l in collector.log.lines if f"tracing pid {target.pid}" in l)
        assert f"goroutines, go{version}" in line, line
        first = 1
        for clients, n in LEVELS.items():
            ids = list(range(first, first + n))
            first += n
            paths = {f"/infer?id={i}&launches={K}&mode={MODES[i % len(MODES)]}": i for i in ids}
            out = fetch_all(target.port, list(paths), clients, 60)
            assert sorted(paths[p] for p in out.ok) == ids and not out.errors, out.errors[:5]
            assert all(out.body[p] == f"{paths[p]}\n".encode() for p in out.ok)
            wait_for_ids(receiver, target.pid, set(ids))
            check = Check(list(receiver.spans), target.pid, ids)
            summary = (f"go{version} {'stripped' if stripped else 'symbols'} GOMAXPROCS={procs}, {clients} clients: "
                       f"exact {check.exact}/{n}, under a wrong request {len(check.wrong)}, missing "
                       f"{len(check.missing)}, children by attribution {dict(check.attribution)}, max open "
                       f"{check.overlap}")
            print(summary)
            assert not check.missing, summary
            assert not check.wrong, f"{check.wrong[:8]}; {summary}"
            if clients > 1:
                assert check.overlap >= 2, summary  # the load really overlapped
            assert check.exact >= (1.0 if clients == 1 else 0.99) * n, f"{summary}; e.g. {check.not_exact[:5]}"
    finally:
        target.stop()


def _steps(target: Target) -> dict[int, set]:
    return {int(m.group(1)): {int(i) for i in m.group(2).split()}
            for m in (STEP_RE.search(l.strip()) for l in target.log.lines) if m}


def test_batcher_steps_are_shared_and_background_work_outside(traced):
    """Last in the module: it stops the collector to flush the process windows."""
    collector, receiver = traced
    target = _server(collector, NEWEST, True, 4, "background")
    try:
        ids = list(range(1, BATCHED + 1))
        paths = {f"/infer?id={i}&launches={K}&mode=batch": i for i in ids}
        out = fetch_all(target.port, list(paths), 8, 60)
        assert sorted(paths[p] for p in out.ok) == ids and not out.errors, out.errors[:5]
        wait_for_ids(receiver, target.pid, set(ids))
        collector.stop()  # the last windows go out
        steps = _steps(target)
    finally:
        target.stop()
    assert sorted(i for s in steps.values() for i in s) == ids
    assert any(len(s) > 1 for s in steps.values()), steps  # the requests did batch
    spans = list(receiver.spans)
    servers = {request_id(s): s for s in server_spans(spans, target.pid)}
    by_span = {(s.trace_id, s.span_id): rid for rid, s in servers.items()}
    under = [c for s in servers.values() for c in children_of(spans, s)]
    assert not under, [(c.name, c.attributes.get("gpu.grid"), c.attributes.get(ATTRIBUTION)) for c in under[:8]]

    windows = [s for s in spans if s.parent_span_id == "" and s.attributes.get("process.pid") == target.pid
               and s.kind != 2]
    shared = [w for w in windows if w.attributes.get(ATTRIBUTION) == "shared"]
    launches = Counter()
    for w in shared:
        grids = {k.attributes["gpu.grid"][0] for k in children_of(spans, w)
                 if k.name == LAUNCH and ROLLUP not in k.attributes}
        assert 0 not in grids, "background work on a shared window"
        linked = {by_span[link] for link in w.links if link in by_span}
        in_flight = {rid for rid, s in servers.items() if s.start_ns <= w.end_ns and s.end_ns >= w.start_ns}
        assert grids <= linked <= in_flight, (grids, linked, in_flight)
        launches.update(grids)
    assert set(launches) == set(ids), sorted(set(ids) - set(launches))  # every batched launch on a shared window

    outside = sum(w.attributes.get("gpu.launches", 0) for w in windows if w.attributes.get(ATTRIBUTION) == "outside")
    others = Counter(w.attributes.get(ATTRIBUTION) for w in windows) - Counter({"shared": len(shared), "outside": 10**9})
    print(f"batcher: {len(steps)} steps, {len(shared)} shared windows; background: {outside} launches on outside "
          f"windows; other windows {dict(others)}")
    assert outside > 0 and not others, (outside, dict(others))
