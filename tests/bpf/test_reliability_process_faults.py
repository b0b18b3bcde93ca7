"""Process faults: a traced process SIGKILLed mid-request, hundreds of short-lived
CUDA processes, a libcudart unloaded, reloaded and copied. Open requests are closed
or counted, attribution never crosses processes, and the collector's tables (the
SIGUSR1 "state:" line) return to where they were."""
from __future__ import annotations

import os
import random
import shutil
import signal
import socket
import subprocess
import sys

import pytest

from tests.bpf.targets.relia_support import (TARGETS, build_c, cudart_path, make_receiver_class,
                                             rss_kb, state, stopped_counters, wait_until)
from tests.harness import Target, children_of, server_spans

LEAK_KEYS = ("bpf.traced", "bpf.http_active", "bpf.conns", "bpf.rollup", "bpf.in_call",
             "procs", "conns", "open_requests", "held_for_cost", "resources")


@pytest.fixture
def receiver():
    r = make_receiver_class()().start()
    yield r
    r.stop()


def _tables(collector, receiver) -> dict:
    """The state line's table sizes (bpf.conns holds traced processes' connections only)."""
    s = state(collector)
    return {k: s[k] for k in LEAK_KEYS}


def _outside(spans, pid):
    return [s for s in spans if s.parent_span_id == "" and s.attributes.get("process.pid") == pid
            and s.attributes.get("otel_gpu.attribution") == "outside"]


@pytest.fixture
def killed(receiver, start_collector):
    """A traced server SIGKILLed while a request is open and its CUDA calls are made;
    yields (collector, pid, tables before the target started, tables once settled)."""
    collector = start_collector("--exe", "relia_kill")  # this test's process only: tables are exact
    baseline = _tables(collector, receiver)
    target = Target([sys.executable, str(TARGETS / "slow_http.py"), "0"], {"RELIA_COMM": "relia_kill"})
    try:
        collector.wait_traced(target.pid)
        target.go()
        client = socket.create_connection(("127.0.0.1", target.port))
        client.sendall(b"GET /slow?launches=3&ms=60000 HTTP/1.1\r\nHost: x\r\n\r\n")
        assert target.log.wait_for("launched 3", 10)
        # The collector reads the request's records a moment after the target made them.
        assert wait_until(lambda: _tables(collector, receiver)["open_requests"] == 1, 10)
        os.kill(target.pid, signal.SIGKILL)
        target.proc.wait(10)
        client.close()
        receiver.wait_for(lambda s: any(x.attributes["url.path"] == "/slow" for x in server_spans(s, target.pid)), 12)
        # cleanup happens on the collector's 5 s flush
        wait_until(lambda: _tables(collector, receiver) == baseline, 12, 1)
        yield collector, target.pid, baseline, _tables(collector, receiver)
    finally:
        target.stop()


def test_sigkill_mid_request_closes_the_request_with_an_error(killed, receiver):
    collector, pid, _, _ = killed
    assert collector.stop() == 0
    counters = stopped_counters(collector)
    assert counters.get("requests_incomplete", 0) >= 1, counters
    slow = [s for s in server_spans(receiver.spans, pid) if s.attributes["url.path"] == "/slow"]
    assert len(slow) <= 1
    if slow:  # closed with an error (a counted drop without a span would also do)
        (span,) = slow
        assert span.status_code == 2, "span of the killed request must have status ERROR"
        assert receiver.messages[span.span_id], "ERROR status without a description"
        assert span.attributes["gpu.launches"] == 3
        assert span.attributes.get("error.type") == "incomplete"
        assert len(children_of(receiver.spans, span)) == 3


def test_sigkill_mid_request_leaks_nothing(killed, receiver):
    collector, pid, baseline, after = killed
    assert after == baseline, f"tables not back to baseline after the kill: before {baseline}, after {after}"
    (span,) = [s for s in server_spans(receiver.spans, pid) if s.attributes["url.path"] == "/slow"]
    assert span.resource.get("service.name") == "slow_http", span.resource


def _run_burst(exe: str, lib: str, n: int, rng: random.Random, parallel: int = 8) -> dict:
    """n short-lived processes, `parallel` at a time; pid -> launches it made."""
    made: dict = {}
    reused = 0
    for start in range(0, n, parallel):
        procs = []
        for _ in range(min(parallel, n - start)):
            k = rng.randint(1, 40)
            procs.append((subprocess.Popen([exe, lib, str(k)], stdout=subprocess.PIPE, text=True), k))
        for p, k in procs:
            out, _ = p.communicate(timeout=30)
            assert p.returncode == 0 and out.split() == ["pid", str(p.pid), "launches", str(k)], out
            reused += p.pid in made
            made.setdefault(p.pid, []).append(k)
    if reused:
        print(f"PID reuse seen: {reused} pids")
    return made


def _anchor() -> Target:
    """A process holding libcudart mapped, so the collector probes the file before
    the short-lived ones start (they live ~5 ms, less than a discovery scan)."""
    code = ("import sys; from otel_gpu.demo.cuda_work import CudaWork; w = CudaWork();"
            "print('listening on 0', file=sys.stderr, flush=True); sys.stdin.readline()")
    return Target([sys.executable, "-c", code])


@pytest.fixture
def burst(tmp_path, receiver, start_collector):
    collector = start_collector()
    anchor = _anchor()
    exe, lib = build_c("cudart_burst", tmp_path), cudart_path()
    try:
        collector.wait_traced(anchor.pid)
        _run_burst(exe, lib, 16, random.Random(1))  # warm-up: first resources, exporter connections
        wait_until(lambda: False, 6)  # one flush interval
        before, rss_before = _tables(collector, receiver), rss_kb(collector.proc.pid)
        made = _run_burst(exe, lib, 200, random.Random(2))
        yield collector, made, before, rss_before
    finally:
        anchor.stop()


def _launches_by_pid(spans, pids) -> dict:
    got: dict = {}
    for s in spans:
        if s.parent_span_id == "" and s.attributes.get("process.pid") in pids:
            got[s.attributes["process.pid"]] = got.get(s.attributes["process.pid"], 0) + s.attributes["gpu.launches"]
    return got


def test_hundreds_of_short_lived_processes(burst, receiver):
    """Each process's launches exactly on its own spans, the collector's memory bounded,
    and no state left once they are gone (one burst for the three: it is the slow part)."""
    collector, made, before, rss_before = burst
    want = {pid: sum(ks) for pid, ks in made.items()}
    ok = receiver.wait_for(lambda s: _launches_by_pid(s, want) == want, 25)
    got = _launches_by_pid(receiver.spans, want)
    assert ok, {pid: (want[pid], got.get(pid)) for pid in want if got.get(pid) != want[pid]}
    for s in receiver.spans:
        pid = s.attributes.get("process.pid")
        if pid in want:
            assert s.resource["process.pid"] == pid
            assert s.attributes.get("otel_gpu.attribution", "outside") == "outside" or s.parent_span_id
            if s.parent_span_id == "":
                kids = children_of(receiver.spans, s)
                assert sum(k.attributes["gpu.rollup.count"] for k in kids) == s.attributes["gpu.launches"]
    grown = rss_kb(collector.proc.pid) - rss_before
    assert grown < 30 * 1024, f"collector RSS grew by {grown} kB over 200 processes"

    def tables_grown() -> dict:
        after = _tables(collector, receiver)
        return {k: (before[k], after[k]) for k in LEAK_KEYS if after[k] - before[k] > 20}
    wait_until(lambda: not tables_grown(), 11, interval=1.0)  # two flushes: rollups read, exits forgotten
    left = tables_grown()
    assert not left, f"{len(made)} processes came and went; tables grew (before, after): {left}"
    assert collector.stop() == 0


def test_cudart_unloaded_reloaded_and_copied(tmp_path, receiver, start_collector):
    lib = cudart_path()
    copy = tmp_path / "libcudart-relia.so.12"
    shutil.copy(lib, copy)
    exe = build_c("cudart_reload", tmp_path)
    collector = start_collector()
    target = Target([exe, lib, str(copy), "4", "6", "9"])
    try:
        target.go_raw()
        assert target.log.wait_for("loaded first", 10)
        collector.wait_traced(target.pid)
        target.go_raw()
        assert target.log.wait_for("loaded again", 10)
        target.go_raw()
        assert target.log.wait_for("loaded copy", 10)
        # dlclose really unmaps libcudart here: only the copy is mapped now
        assert collector.log.wait_for(f"probes to /proc/{target.pid}/root{copy}", 10) or \
            collector.log.wait_for(f"probes to {copy}", 0.1), "the copy was never probed"
        target.go_raw()
        assert target.log.wait_for("launched copy 9", 10)
        ok = receiver.wait_for(lambda s: sum(w.attributes["gpu.launches"] for w in _outside(s, target.pid)) >= 19, 20)
        total = sum(w.attributes["gpu.launches"] for w in _outside(receiver.spans, target.pid))
        print("".join(l for l in target.log.lines if "dlclose" in l))
        target.go_raw()
    finally:
        target.stop()
    assert ok and total == 4 + 6 + 9, (total, collector.log.lines[-10:])
    assert collector.stop() == 0
