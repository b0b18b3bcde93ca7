"""Backend faults: the OTLP endpoint down for 10 s (600 requests) then back on the same port; a ring
buffer too small for a burst of launches. The collector keeps running with bounded
memory, counts and logs what it dropped, and recovers by itself."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
import urllib.request

import pytest

from otel_gpu.demo.runner import LineWatcher, free_port
from tests.bpf.targets.relia_support import TARGETS, make_receiver_class, rss_kb, stopped_counters
from tests.harness import ROOT, Target, server_spans

OUTAGE_S = 6
RATE = 60  # requests per second while the backend is down: 360 in all (3 spans each), the queue holds 256


@pytest.fixture
def receiver():
    r = make_receiver_class()().start()
    yield r
    r.stop()


def _target(collector, name: str, started: list) -> Target:
    """slow_http.py renamed to `name`: with --exe name the collector traces it alone, so
    other CUDA processes on the host cannot move its memory or counters."""
    t = Target([sys.executable, str(TARGETS / "slow_http.py"), "0"], {"RELIA_COMM": name})
    started.append(t)
    collector.wait_traced(t.pid)
    t.go()
    return t


def _work(receiver, pid, launches):
    return [s for s in server_spans(receiver.spans, pid) if s.attributes["url.path"] == "/work"
            and s.attributes["gpu.launches"] == launches]


def test_otlp_endpoint_down_then_back(receiver, start_collector, targets):
    collector = start_collector("--exe", "relia_otlp", allow_errors=("Failed to export",),  # the backend is down
                                OTEL_BSP_MAX_QUEUE_SIZE="256",
                                OTEL_BSP_MAX_EXPORT_BATCH_SIZE="64", OTEL_EXPORTER_OTLP_TIMEOUT="2")
    target = _target(collector, "relia_otlp", targets)
    target.get("/work?launches=1")
    assert receiver.wait_for(lambda s: len(_work(receiver, target.pid, 1)) == 1)
    port = receiver.port
    receiver.stop()
    rss_start = rss_kb(collector.proc.pid)
    rss_max, sent = rss_start, 0
    t0 = time.monotonic()
    while time.monotonic() - t0 < OUTAGE_S:  # bounded rate: one request per 1/RATE s
        target.get("/work?launches=2")
        sent += 1
        if sent % RATE == 0:
            rss_max = max(rss_max, rss_kb(collector.proc.pid))
            assert collector.proc.poll() is None, "collector died while the backend was down"
        time.sleep(max(0.0, t0 + sent / RATE - time.monotonic()))
    assert sent >= OUTAGE_S * RATE * 0.8
    back = make_receiver_class()(port).start()  # the same address: no collector restart
    try:
        t_back, probes = time.monotonic(), 0
        while time.monotonic() - t_back < 90 and not _work(back, target.pid, 7):
            target.get("/work?launches=7")  # until the exporter has reconnected by itself
            probes += 1
            time.sleep(1)
        reconnect_s = time.monotonic() - t_back
        print(f"exporter reconnected {reconnect_s:.0f} s after the backend came back; "
              f"{len(_work(back, target.pid, 7))} of {probes} requests made meanwhile arrived")
        assert _work(back, target.pid, 7), "no span arrived within 90 s of the backend coming back"
        for _ in range(5):  # once reconnected, every new request's span arrives
            target.get("/work?launches=9")
        assert back.wait_for(lambda s: len(_work(back, target.pid, 9)) == 5, 20), collector.log.lines[-10:]
        assert collector.proc.poll() is None
        assert collector.stop() == 0
    finally:
        back.stop()
    counters = stopped_counters(collector)
    print(counters, len(collector.log.lines), "log lines")
    assert rss_max - rss_start < 30 * 1024, f"RSS grew {rss_max - rss_start} kB during the outage"
    lost = counters.get("spans_export_failed", 0) + counters.get("spans_dropped_queue_full", 0)
    assert lost > 0, counters
    assert any("OTLP export failed" in l for l in collector.log.lines), [l for l in collector.log.lines if "xport" in l][-8:]
    if counters.get("spans_dropped_queue_full"):  # refused connections fail fast: the queue may never fill
        assert any("OTLP queue full" in l for l in collector.log.lines)
    # Rate-limited logging: a 60 s outage is a handful of lines, not one per batch.
    assert len([l for l in collector.log.lines if "OTLP " in l and "WARNING" in l]) < 20
    for s in _work(back, target.pid, 7) + _work(back, target.pid, 9):
        assert s.attributes["http.response.status_code"] == 200


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def _lost_metric(text: str) -> float:
    m = re.search(r"^otel_gpu_events_lost_total(?:\{[^}]*\})? (\S+)$", text, re.M)
    return float(m.group(1)) if m else -1.0


def test_a_burst_past_a_tiny_ring_buffer_is_counted_exactly(receiver, start_collector, targets):
    """A 4 KiB ring buffer and 20,000 launches in one request: before in-kernel request
    counts, most were lost (counted in lost_events). Now each call past the streaming
    budget, or past the ring buffer's high-water mark, is counted in the kernel per
    request (req_agg), so the span's launches are exact and nothing is lost."""
    prom = free_port()
    collector = start_collector("--exe", "relia_ring", "--ringbuf-pages", "1", "--prometheus-port", str(prom))
    target = _target(collector, "relia_ring", targets)
    target.get("/work?launches=20000")
    target.get("/work?launches=3")  # a normal request after the burst still gives its span
    assert receiver.wait_for(lambda s: len(_work(receiver, target.pid, 20000)) == 1
                             and len(_work(receiver, target.pid, 3)) == 1, 20), collector.log.lines[-10:]
    (burst,) = _work(receiver, target.pid, 20000)
    kids = [k for k in receiver.spans if k.parent_span_id == burst.span_id and k.trace_id == burst.trace_id]
    assert sum(k.attributes.get("gpu.rollup.count", 1) for k in kids
               if k.attributes.get("gpu.cuda.call") == "cudaLaunchKernel") == 20000
    assert _lost_metric(_scrape(prom)) <= 0  # absent or 0: nothing lost
    assert collector.stop() == 0
    assert stopped_counters(collector).get("lost_events", 0) == 0


def test_small_otlp_queue_alone_is_accepted(receiver):
    """OTEL_BSP_MAX_QUEUE_SIZE=256 is a valid setting: the batch size should follow it."""
    env = dict(os.environ, OTEL_EXPORTER_OTLP_ENDPOINT=receiver.endpoint, OTEL_BSP_MAX_QUEUE_SIZE="256")
    proc = subprocess.Popen([sys.executable, "-m", "otel_gpu.cli", "run", "--no-console"], stderr=subprocess.PIPE,
                            text=True, env=env, cwd=ROOT)
    log = LineWatcher(proc.stderr, echo=None)
    try:
        deadline = time.monotonic() + 60
        while proc.poll() is None and not log.wait_for("ready", 0.2) and time.monotonic() < deadline:
            pass
        time.sleep(0.5)  # a crash right after start shows up here
        assert proc.poll() is None, "".join(log.lines)
        assert not any("Traceback" in l for l in log.lines), "".join(log.lines)
    finally:
        if proc.poll() is None:
            proc.send_signal(signal.SIGTERM)
            proc.wait(30)
