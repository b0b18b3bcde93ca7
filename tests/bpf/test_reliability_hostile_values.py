"""Hostile values through the real probes (issue 15): a client choosing 10,000 distinct
paths cannot grow the routes in spans, store and metrics past the per-service cap; a
traced process's cudaMemcpy of 2^64-1 bytes is exported clamped and metrics keep going
out over OTLP; a launch config the probe cannot read is flagged, never exported as 0x0x0.
Real collector, real libcudart (no GPU: calls fail with 35 after the probe saw them),
cuda_http's stdlib server, the real OTLP/gRPC exporters to a receiver on 127.0.0.1."""
from __future__ import annotations

import http.client
import json
import subprocess
import sys
import time

from tests.bpf.targets.relia_support import rss_kb, stopped_counters
from tests.harness import ROOT, TARGETS, Target, children_of, server_spans

CAP = 20
WORDS = 10_000
INT64_MAX = 2**63 - 1


def _target(service: str) -> Target:
    return Target([sys.executable, str(TARGETS / "hostile_values.py"), "stdlib", "0"],
                  {"OTEL_SERVICE_NAME": service, "PYTHONPATH": f"{TARGETS}:{ROOT}"})


def _metric_points(receiver, metric: str, service, after: int = 0) -> list:
    """(request index, attributes, point) of `metric` for `service` (None: any) in the
    metric exports."""
    out = []
    for i, req in enumerate(list(receiver.metric_requests)[after:], after):
        for rm in req.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != metric:
                        continue
                    data = getattr(m, m.WhichOneof("data"))
                    for p in data.data_points:
                        attrs = {kv.key: getattr(kv.value, kv.value.WhichOneof("value")) for kv in p.attributes}
                        if service is None or attrs.get("service.name") == service:
                            out.append((i, attrs, p))
    return out


def test_distinct_paths_fold_to_at_most_the_cap(tmp_path, receiver, start_collector):
    db = str(tmp_path / "store.db")
    service = "hostile-routes"
    collector = start_collector("--max-routes", str(CAP), OTEL_GPU_STORE=db, OTEL_BSP_MAX_QUEUE_SIZE="32768")
    target = _target(service)
    try:
        collector.wait_traced(target.pid)
        target.go()
        rss_before, t0 = rss_kb(collector.proc.pid), time.monotonic()
        conn = http.client.HTTPConnection("127.0.0.1", target.port, timeout=20)  # keep-alive
        sent, deadline = 0, time.monotonic() + 60
        while sent < WORDS and time.monotonic() < deadline:
            conn.request("GET", f"/search/w{sent:05d}x")
            conn.getresponse().read()
            sent += 1
        conn.close()
        assert sent >= 2_000, f"only {sent} requests in 60 s"
        receiver.wait_for(lambda s: len(server_spans(s, target.pid)) >= sent, timeout=60)
        rss_after, took = rss_kb(collector.proc.pid), time.monotonic() - t0
        assert collector.stop() == 0
    finally:
        target.stop()
    spans = server_spans(receiver.spans, target.pid)
    counters = stopped_counters(collector)
    searches = [s for s in spans if s.attributes["url.path"].startswith("/search/")]
    assert len(searches) >= 0.9 * sent, (len(searches), sent, counters)
    routes = {s.attributes["http.route"] for s in spans}
    assert len(routes) <= CAP, routes
    assert "/search/{param}" in routes  # learned from the path shapes, not only {other}
    folded = sum(s.attributes["http.route"] != s.attributes["url.path"] for s in spans)
    assert folded >= len(searches) - CAP
    print(f"\n{sent} requests in {took:.1f} s, {len(searches)} spans, {len(routes)} routes, "
          f"routes_folded={counters['routes_folded']}, collector RSS {rss_before // 1024} -> {rss_after // 1024} MB")
    lost = counters.get("lost_events", 0) + counters.get("ringbuf_full", 0)
    assert counters["routes_folded"] == folded if not lost else counters["routes_folded"] >= folded

    report = subprocess.run([sys.executable, "-m", "otel_gpu.cli", "report", "--db", db, "--format", "json",
                             "--service", service], capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert report.returncode == 0, report.stderr
    features = {r["feature"] for r in json.loads(report.stdout)["rows"] if r["feature"] is not None}
    assert features and len(features) <= CAP and features <= routes

    metric_routes = {a["http.route"] for _, a, _ in
                     _metric_points(receiver, "http.server.request.duration", service)}
    assert metric_routes and len(metric_routes) <= CAP and metric_routes <= routes
    # the fold count goes out with the collector's own metrics too
    assert any(a.get("otel_gpu.reason") == "routes_folded" and p.as_int > 0 for _, a, p in
               _metric_points(receiver, "otel_gpu.drops", None))


def test_huge_copy_and_unreadable_config(receiver, start_collector):
    service = "hostile-values"
    collector = start_collector(OTEL_BSP_MAX_QUEUE_SIZE="8192")
    target = _target(service)
    try:
        collector.wait_traced(target.pid)
        target.go()
        for path in ("/hugecopy", "/badconfig", "/goodconfig", "/work?copies=1&h2d=4096"):
            target.get(path)

        def by_path(spans):
            return {s.attributes["url.path"]: s for s in server_spans(spans, target.pid)}
        assert receiver.wait_for(lambda s: {"/hugecopy", "/badconfig", "/goodconfig", "/work"} <= set(by_path(s)))
        spans = by_path(receiver.spans)
        # the copy: exported, clamped and flagged on the call span and the request's summary
        huge = spans["/hugecopy"]
        [copy] = [c for c in children_of(receiver.spans, huge) if c.name == "cudaMemcpy"]
        assert copy.attributes["gpu.memcpy.bytes"] == INT64_MAX and copy.attributes["otel_gpu.value_clamped"]
        assert huge.attributes["gpu.memcpy.h2d.bytes"] == INT64_MAX and huge.attributes["otel_gpu.value_clamped"]
        # the unreadable config: flagged, no dims; the readable one: its dims, no flag
        [bad] = children_of(receiver.spans, spans["/badconfig"])
        assert bad.attributes["gpu.cuda.args_unreadable"] is True
        assert not {"gpu.grid", "gpu.block", "gpu.shared_memory.bytes", "gpu.stream"} & set(bad.attributes)
        [good] = children_of(receiver.spans, spans["/goodconfig"])
        assert good.attributes["gpu.grid"] == [2, 3, 4] and good.attributes["gpu.block"] == [64, 1, 1]
        assert "gpu.cuda.args_unreadable" not in good.attributes

        # metrics keep going out over OTLP after the absurd copy: a periodic export (10 s)
        # carries this service's copy bytes, within int64
        since = len(receiver.metric_requests)
        ok = receiver._cond.acquire()
        try:
            got = receiver._cond.wait_for(
                lambda: _metric_points(receiver, "gpu.cuda.memory.copies", service, since), timeout=30)
        finally:
            receiver._cond.release()
        assert ok and got, "no metrics export after the 2^64-1 copy"
        values = [p.sum for _, _, p in _metric_points(receiver, "gpu.cuda.memory.copies", service, since)]
        assert all(0 < v <= INT64_MAX for v in values)
        target.get("/work?copies=1&h2d=4096")  # and later work still counts
        assert collector.stop() == 0
    finally:
        target.stop()
    counters = stopped_counters(collector)
    assert counters.get("metric_values_clamped", 0) >= 1
    assert "metrics_export_failed" not in counters
    log = "".join(collector.log.lines)
    assert "Traceback" not in log and "Exception while exporting" not in log and "Invalid type" not in log
