"""Under HTTP load every request keeps its server span with exact aggregates (issue 13):
the bench's stdlib threaded service (100 launches + 2 copies per request, real
libcudart) at the rate it serves here, over a few keep-alive connections. At ~1,000
req/s x 64 streamed calls the consumer fell seconds behind, the ring buffer's HTTP
reserve overflowed and requests never ended (9,570 of 12,000 finished); now the kernel
streams at most --stream-rate calls a second and counts the rest."""
from __future__ import annotations

import json
import subprocess
import sys
import time

import pytest

from tests.harness import ROOT, Target, server_spans

# 4,000 requests, ~4-8 s at the rate the service serves on 2 cores: enough for the old
# bug. Without the stream rate (--stream-rate 10000000) 4 x 1000 lost 54 spans (3,946 /
# 4,000, 539 req/s, load average ~30; 2026-11-23); it was 4 x 3000 before.
CONNS, PER_CONN = 4, 1000
LAUNCHES, H2D, D2H = 100, 64 * 1024, 4 * 1024  # bench/http_service.py GET /work and /layers
# Distinct kernels a request launches, and requests a connection: /layers makes 34 counts a
# request in req_agg; 4 x 1000 of them outrun the collector on 2 shared cores until its ring
# buffer is half full now and then, when it sheds counts in the kernel (kernel_io/program.py
# poll; exact in 6 of 12 runs, 44-799 spans short in the others; 1,259-1,435 before counts
# were taken ahead of the stream; exact in 12 of 12 since they are read as the kernel's
# bytes, docs/performance.md note 41), so half as many: CI's host may be slower.
PATHS = {"/work": (1, PER_CONN), "/layers": (32, PER_CONN // 2)}


def _load(port: int, path: str) -> dict:
    """bench/load.py in its own process (no GIL shared with the receiver); bounded in
    count and time."""
    out = subprocess.run([sys.executable, "-m", "bench.load", "--port", str(port), "--path", path,
                          "--conns", str(CONNS), "--seconds", "90", "--max", str(CONNS * PATHS[path][1])],
                         capture_output=True, text=True, timeout=150, check=True, cwd=ROOT)
    return json.loads(out.stdout)


def _wait_until_traced_end_to_end(receiver, service) -> None:
    """Until a warm-up request (another route) has its span: the load then measures load
    alone, not the first moments after `tracing pid` (tests/bpf/test_first_requests.py)."""
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        service.get("/launch/1")
        if receiver.wait_for(lambda spans: server_spans(spans, service.pid), timeout=1):
            return
    raise AssertionError("no span for a warm-up request in 30 s")


@pytest.mark.parametrize("path", PATHS)
def test_every_request_under_load_has_its_exact_span(path, receiver, start_collector, targets):
    """/layers: a request's counts are dozens of req_agg entries; a collector a batch behind
    used to fill the table with the backlog's (kernel_io/reader.py AggregateReader)."""
    service = Target([sys.executable, "-m", "bench.http_service"])
    targets.append(service)
    collector = start_collector("--pid", str(service.pid))  # other tests' CUDA processes share the exporter otherwise
    collector.wait_traced(service.pid)
    _wait_until_traced_end_to_end(receiver, service)
    sent = _load(service.port, path)
    assert sent["errors"] == 0 and sent["ok"] == CONNS * PATHS[path][1], sent

    def work(spans):
        return [s for s in server_spans(spans, service.pid) if s.attributes.get("http.route") == path]
    receiver.wait_for(lambda spans: len(work(spans)) >= sent["ok"], timeout=90)
    spans = work(receiver.spans)
    if len(spans) != sent["ok"]:
        collector.stop()  # its `stopped:` line says what was lost where
        summary = [l.strip() for l in collector.log.lines if "stopped:" in l or "WARNING" in l][-6:]
        raise AssertionError(f"{len(spans)} server spans for {sent['ok']} requests ({sent['rps']:.0f} req/s): "
                             + "\n".join(summary))
    wrong = [s.attributes for s in spans
             if (s.attributes.get("gpu.launches"), s.attributes.get("gpu.kernels.distinct"),
                 s.attributes.get("gpu.memcpy.h2d.bytes"), s.attributes.get("gpu.memcpy.d2h.bytes"),
                 s.attributes.get("otel_gpu.calls.ambiguous", 0))
             != (LAUNCHES, PATHS[path][0], H2D, D2H, 0)]
    assert not wrong, f"{len(wrong)} spans with wrong aggregates, e.g. {wrong[0]}"
