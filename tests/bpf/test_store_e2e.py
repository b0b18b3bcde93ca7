"""The local store beside OTLP: a real collector writes it (OTEL_GPU_STORE), and
`otel-gpu report` / `otel-gpu traces` read back figures that match the OTLP spans."""
from __future__ import annotations

import json
import math
import subprocess
import sys

from tests.harness import ROOT, children_of, server_spans

KERNEL = "matmul_tile(float const*, float const*, float*, int)"


def _cli(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "otel_gpu.cli", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _work(spans, pid):
    """go() probed /nothing first: that request is stored too, under its own route."""
    return [s for s in server_spans(spans, pid) if s.attributes.get("http.route") == "/work"]


def _nearest_rank(values, p):
    v = sorted(values)
    return v[max(1, math.ceil(p / 100 * len(v))) - 1]


def test_report_and_traces_match_otlp(tmp_path, receiver, start_collector, start_target):
    db = str(tmp_path / "otel-gpu.db")
    n, k = 4, 3
    collector = start_collector(OTEL_GPU_STORE=db)
    target = start_target("stdlib")
    collector.wait_traced(target.pid)
    target.go()
    for _ in range(n):
        target.get(f"/work?launches={k}&copies=4&h2d=1000&d2h=300")
    assert receiver.wait_for(lambda spans: len(_work(spans, target.pid)) >= n)
    assert collector.stop() == 0  # the store is closed on shutdown
    servers = _work(receiver.spans, target.pid)
    assert len(servers) == n

    report = json.loads(_cli("report", "--db", db, "--format", "json", "--service", "cuda_http"))
    [row] = [r for r in report["rows"] if r["feature"] == "/work"]
    assert (row["service"], row["requests"]) == ("cuda_http", n)
    assert row["launches_per_request"] == k
    assert row["copy_bytes"] == n * (2 * 1000 + 2 * 300)
    durations = [(s.end_ns - s.start_ns) / 1e6 for s in servers]
    assert row["p50_ms"] == _nearest_rank(durations, 50) and row["p95_ms"] == _nearest_rank(durations, 95)
    assert sum(r["share"] for r in report["rows"]) == 1.0

    listing = _cli("traces", "--db", db, "--route", "/work")
    assert listing.count("GET /work") == n
    assert all(s.trace_id[:12] in listing for s in servers)

    first = servers[0]
    tree = _cli("traces", "--db", db, "--trace-id", first.trace_id)
    assert f"trace {first.trace_id}" in tree and "host-side enqueue" in tree
    assert tree.count(KERNEL) == k
    assert tree.count("cudaMemcpy") == len(children_of(receiver.spans, first)) - k
