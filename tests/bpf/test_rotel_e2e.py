"""Spans and metrics through an OTLP implementation that is not Python: rotel, an
OpenTelemetry collector written in Rust (PyPI `rotel`, which ships the `rotel-agent`
binary). The collector exports to rotel over OTLP/gRPC or OTLP/HTTP-protobuf; rotel
forwards over OTLP/gRPC to the test's receiver. What arrives must be what the collector
made: the same spans are also written to the local store (`--store`, the same SDK
spans through another exporter), and every span that came through rotel must equal its
stored copy, field by field."""
from __future__ import annotations

import json
import os
import signal
import sqlite3
import subprocess
import time
import uuid

import pytest

from otel_gpu.demo.runner import LineWatcher, free_port, stop_process, wait_for_port
from tests.harness import children_of, server_spans

N, LAUNCHES = 3, 4
WORK = f"/work?launches={LAUNCHES}&copies=2&h2d=1000&d2h=10"
KERNEL = "matmul_tile(float const*, float const*, float*, int)"


def _rotel_agent() -> str:
    try:
        from rotel.agent import Agent
    except ImportError:
        pytest.fail("rotel is not installed: scripts/setup.sh installs the test extras (pip install -e '.[test]')")
    try:
        out = subprocess.run([str(Agent.agent_path), "--version"], capture_output=True, text=True, timeout=20)
    except OSError as e:  # wrong architecture, missing loader
        pytest.skip(f"the rotel binary cannot run on this platform: {e}")
    if out.returncode != 0:
        pytest.skip(f"the rotel binary cannot run on this platform: {(out.stderr or out.stdout).strip()}")
    return str(Agent.agent_path)


class Rotel:
    """rotel-agent in the foreground: OTLP gRPC and HTTP receivers on 127.0.0.1, one OTLP
    exporter (gRPC) to `forward_to`."""

    def __init__(self, binary: str, forward_to: str, pid_file: str) -> None:
        self.grpc_port, self.http_port = free_port(), free_port()
        self.proc = subprocess.Popen(
            [binary, "start", "--otlp-grpc-endpoint", f"127.0.0.1:{self.grpc_port}",
             "--otlp-http-endpoint", f"127.0.0.1:{self.http_port}", "--exporter", "otlp",
             "--otlp-exporter-endpoint", forward_to, "--otlp-exporter-protocol", "grpc",
             "--pid-file", pid_file],
            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True, env={**os.environ, "NO_COLOR": "1"})
        self.log = LineWatcher(self.proc.stdout, echo=None)
        if not (wait_for_port(self.grpc_port, 20) and wait_for_port(self.http_port, 20)):
            self.stop()
            raise RuntimeError("rotel did not listen:\n" + "".join(self.log.lines))

    def endpoint(self, protocol: str) -> str:
        return f"http://127.0.0.1:{self.grpc_port if protocol == 'grpc' else self.http_port}"

    def stop(self) -> int:
        return stop_process(self.proc, signal.SIGTERM, 10)


@pytest.fixture
def rotel(receiver, tmp_path):
    r = Rotel(_rotel_agent(), receiver.endpoint, str(tmp_path / "rotel.pid"))
    yield r
    r.stop()


def _stored_spans(db: str, trace_ids: set) -> dict:
    with sqlite3.connect(db) as c:
        rows = c.execute("SELECT trace_id, span_id, parent_span_id, name, kind, start_ns, end_ns, status_code,"
                         " attributes, service, pid FROM spans").fetchall()
    return {(r[0], r[1]): r for r in rows if r[0] in trace_ids}


def _launch_counts(receiver, service: str) -> list:
    """Every gpu.cuda.kernel.launch.calls data point of `service` on /work that came through rotel:
    (value, unit, monotonic, temporality)."""
    out = []
    for request in list(receiver.metric_requests):
        for rm in request.resource_metrics:
            for sm in rm.scope_metrics:
                for m in sm.metrics:
                    if m.name != "gpu.cuda.kernel.launch.calls":
                        continue
                    for p in m.sum.data_points:
                        attrs = {kv.key: kv.value.string_value for kv in p.attributes}
                        if attrs.get("service.name") == service and attrs.get("http.route") == "/work":
                            out.append((p.as_int or p.as_double, m.unit, m.sum.is_monotonic,
                                        m.sum.aggregation_temporality, attrs.get("gpu.kernel.name")))
    return out


@pytest.mark.parametrize("protocol", ["grpc", "http/protobuf"])
def test_spans_and_metrics_arrive_intact_through_rotel(protocol, rotel, receiver, start_collector,
                                                       start_target, tmp_path):
    service = f"rotel-e2e-{uuid.uuid4().hex[:8]}"  # our target's series, not another test's
    store = str(tmp_path / "store.db")
    collector = start_collector("--store", store, OTEL_EXPORTER_OTLP_ENDPOINT=rotel.endpoint(protocol),
                                OTEL_EXPORTER_OTLP_PROTOCOL=protocol)
    target = start_target("stdlib", {"OTEL_SERVICE_NAME": service})
    collector.wait_traced(target.pid)
    target.go()
    for _ in range(N):
        target.get(WORK)

    def complete(spans):
        work = [s for s in server_spans(spans, target.pid) if s.attributes.get("url.path") == "/work"]
        return len(work) >= N and all(len(children_of(spans, s)) >= LAUNCHES + 2 for s in work)
    assert receiver.wait_for(complete, 30), "spans did not come through rotel:\n" + "".join(rotel.log.lines)

    # The launch counter, cumulative, from a periodic export (every 10 s) while the collector
    # runs: its value is every launch of the N requests.
    deadline = time.monotonic() + 40
    while time.monotonic() < deadline and not any(p[0] == N * LAUNCHES for p in _launch_counts(receiver, service)):
        time.sleep(0.2)
    points = _launch_counts(receiver, service)
    assert points, (f"gpu.cuda.kernel.launch.calls of {service} did not come through rotel (metrics received:"
                    f" {sorted(receiver.metric_names)}); rotel said:\n" + "".join(rotel.log.lines)
                    + "collector said:\n" + "".join(collector.log.lines[-30:]))
    assert max(p[0] for p in points) == N * LAUNCHES
    assert {p[1:] for p in points} == {("{call}", True, 2, KERNEL)}  # 2: CUMULATIVE
    assert collector.stop() == 0, "".join(collector.log.lines[-30:])  # the store has every span

    work = [s for s in server_spans(receiver.spans, target.pid) if s.attributes.get("url.path") == "/work"]
    assert len(work) == N and len({s.trace_id for s in work}) == N
    ours = []
    for s in work:
        kids = children_of(receiver.spans, s)
        ours += [s, *kids]
        assert (s.name, s.attributes["http.route"], s.attributes["gpu.launches"]) == ("GET /work", "/work", LAUNCHES)
        assert sorted(c.name for c in kids) == ["cudaLaunchKernel"] * LAUNCHES + ["cudaMemcpy"] * 2
        for c in kids:
            assert c.attributes["otel_gpu.attribution"] == "thread"
            if c.name == "cudaLaunchKernel":  # int arrays and strings, as sent
                assert (c.attributes["gpu.kernel.name"], c.attributes["gpu.grid"], c.attributes["gpu.block"],
                        c.attributes["gpu.shared_memory.bytes"]) == (KERNEL, [7, 3, 1], [128, 2, 1], 256)
        assert sorted((c.attributes["gpu.memcpy.direction"], c.attributes["gpu.memcpy.bytes"])
                      for c in kids if c.name == "cudaMemcpy") == [("d2h", 10), ("h2d", 1000)]
    for span in ours:
        assert span.resource["service.name"] == service and span.resource["process.pid"] == target.pid
        assert span.resource == work[0].resource  # one process, one resource
    assert len({(s.trace_id, s.span_id) for s in ours}) == len(ours) == N * (LAUNCHES + 3)  # none doubled

    # Field by field against the copy the store kept of the same SDK spans.
    stored = _stored_spans(store, {s.trace_id for s in work})
    assert len(stored) == len(ours)
    for s in ours:
        row = stored[(s.trace_id, s.span_id)]
        assert row[2:8] == (s.parent_span_id or None, s.name, s.kind - 1, s.start_ns, s.end_ns, s.status_code), s.name
        assert json.loads(row[8]) == s.attributes, s.name
        assert (row[9], row[10]) == (s.resource["service.name"], s.resource["process.pid"])
