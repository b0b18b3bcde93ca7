"""Device-clock mode through the real probes: a service with real libcudart and the real
device-clock library (over a FAKE CUPTI: no GPU here, so the real one reports nothing; the
target plays CUDA's part, tests/bpf/targets/device_clock_http.py). The collector's uprobe reads
the library's hand-offs, ties each record to its launch or copy, and the spans carry the
device's times: every launch's and copy's device duration encodes its request (url.path)
and its launch (grid x), so a record tied to the wrong call, or a call under the wrong
request, fails. Requests in turn and 8 at once."""
from __future__ import annotations

import shutil
import sqlite3
import sys
import threading

import pytest

from otel_gpu.device_clock import library
from tests.harness import TARGETS, Target, children_of, server_spans

LAUNCHES, COPIES, CLIENTS, ROUNDS = 3, 1, 8, 2
SEQUENTIAL = range(1, 4)
CONCURRENT = range(10, 10 + CLIENTS * ROUNDS)
LEAD_NS = 50_000  # device_clock_http.py's LEAD_US: the device starts no earlier after the call


@pytest.fixture(scope="module")
def built(tmp_path_factory):
    if library.headers() is None or shutil.which("gcc") is None:
        pytest.skip("no CUPTI headers or no gcc: the device-clock library cannot be built")
    out = tmp_path_factory.mktemp("cupti")
    return library.build(out), library.build_fake(out)


def _device_ns(n: int, k: int) -> int:
    """The device time the target gives call k of request n (launches first, then copies)."""
    return (n * 100 + k + 1) * 1000 if k < LAUNCHES else (n * 100 + 50 + k - LAUNCHES) * 1000


def test_spans_carry_the_device_times_of_their_own_calls(built, tmp_path, receiver, start_collector):
    lib, fake = built
    flag = str(tmp_path / "device-clock")
    db = str(tmp_path / "otel-gpu.db")
    collector = start_collector(OTEL_GPU_DEVICE_CLOCK_FLAG=flag, OTEL_GPU_STORE=db)
    target = Target([sys.executable, str(TARGETS / "device_clock_http.py")],
                    {"DEVICE_CLOCK_LIBRARY": str(lib), "OTEL_GPU_CUPTI_LIB": str(fake),
                     "OTEL_GPU_DEVICE_CLOCK_FLAG": flag})
    try:
        collector.wait_traced(target.pid)
        collector.wait_device_clock(target.pid)  # the library loaded before it listened: seen since
        target.go()
        query = f"?launches={LAUNCHES}&copies={COPIES}"
        for n in SEQUENTIAL:
            target.get(f"/infer/{n}{query}")
        for r in range(ROUNDS):
            clients = [threading.Thread(target=target.get, args=(f"/infer/{10 + r * CLIENTS + i}{query}",))
                       for i in range(CLIENTS)]
            for c in clients:
                c.start()
            for c in clients:
                c.join()
        wanted = len(SEQUENTIAL) + len(CONCURRENT)
        assert receiver.wait_for(lambda s: len([x for x in server_spans(s, target.pid)
                                                if x.attributes.get("url.path", "").startswith("/infer/")]) >= wanted)
    finally:
        target.stop()
    assert collector.stop() == 0
    spans = receiver.spans
    servers = {int(s.attributes["url.path"].rsplit("/", 1)[1]): s for s in server_spans(spans, target.pid)
               if s.attributes["url.path"].startswith("/infer/")}
    assert sorted(servers) == [*SEQUENTIAL, *CONCURRENT]
    for n, server in servers.items():
        kids = children_of(spans, server)
        launches = sorted((s for s in kids if s.name == "cudaLaunchKernel"), key=lambda s: s.attributes["gpu.grid"][0])
        copies = sorted((s for s in kids if s.name == "cudaMemcpy"), key=lambda s: s.attributes["gpu.memcpy.bytes"])
        assert len(launches) == LAUNCHES and len(copies) == COPIES, n
        for k, s in enumerate(launches + copies):
            a = s.attributes
            if k < LAUNCHES:  # its own launch, by its grid
                assert a["gpu.grid"][0] == n * 16 + k + 1, (n, k)
            else:
                assert a["gpu.memcpy.bytes"] == n * 1000 + k - LAUNCHES + 1, (n, k)
            assert a["otel_gpu.device.duration_ns"] == _device_ns(n, k), (n, k)
            assert LEAD_NS <= a["otel_gpu.device.queue_ns"] < 10**9, (n, k)
        own = sum(_device_ns(n, k) for k in range(LAUNCHES + COPIES)) / 1e9
        a = server.attributes
        if a.get("otel_gpu.cost.pending"):
            # Its span left while the next request was open and could still share its device
            # stretch (records read in one batch, the loop's window): the cost followed it,
            # into the store (checked below).
            assert "otel_gpu.cost.source" not in a, n
        elif n in SEQUENTIAL:  # alone on the device: its seconds are its own calls' device times
            assert a["otel_gpu.cost.source"] == "device", n
            assert a["otel_gpu.cost.gpu_seconds"] == pytest.approx(own, rel=1e-9), n
        else:  # beside others: shared stretches split, never more than its own
            assert a["otel_gpu.cost.source"] == "device", n
            assert 0 < a["otel_gpu.cost.gpu_seconds"] <= own * (1 + 1e-9), n
    with sqlite3.connect(db) as c:  # where a cost that followed its span went
        stored = dict(c.execute("SELECT span_id, gpu_seconds FROM requests").fetchall())
    for n, server in servers.items():
        own = sum(_device_ns(n, k) for k in range(LAUNCHES + COPIES)) / 1e9
        assert 0 < stored[server.span_id] <= own * (1 + 1e-9), n
    for r in range(ROUNDS):  # each round's shared stretches split: they add up to at most the round's work
        batch = CONCURRENT[r * CLIENTS:(r + 1) * CLIENTS]
        assert sum(stored[servers[n].span_id] for n in batch) <= sum(
            _device_ns(n, k) for n in batch for k in range(LAUNCHES + COPIES)) / 1e9 * (1 + 1e-9)
    counts = collector.counts()
    untied = {k: v for k, v in counts["dropped"].items() if k.startswith("device_")}
    assert untied == {}, untied
    assert counts["counted"]["device_tied"] == len(servers) * (LAUNCHES + COPIES)
