"""The Grafana dashboard on a real Prometheus: Debian's `prometheus` scrapes a running
collector's endpoint (--prometheus-port) while four real services are traced with
traffic (the CUDA HTTP service: launches, copies, syncs, a held GPU for cost, and a
connection of binary garbage, which is a counted drop; a Starlette SSE stream doing GPU
work between chunks; an NCCL service on the stub libnccl; a HIP service on Debian's real
libamdhip64: launches, copies, a graph launch, a sync, all gpu.hip.*). Then every query of
k8s/grafana/otel-gpu-dashboard.json, its variable's too, is evaluated through Prometheus's
HTTP API with Grafana's variables filled as Grafana fills them: each must return series,
and each series must carry the labels its legend shows. Both vendors: the variable lists
the CUDA and the HIP service; a panel whose legend shows `api` has a cuda and a hip series;
and each query on gpu_cuda_/gpu_hip_ metrics, with $service set to the CUDA service alone,
then to the HIP one alone, returns series (of that vendor's api only).

One panel cannot have data on a host without a GPU driver, named in NO_DATA_HERE: every
cudaMalloc (and hipMalloc) through the real libraries fails there, so nothing is ever
live. Its query is still evaluated (a typo in it fails). Without libamdhip64 (scripts/setup.sh
installs it) the HIP service is left out and only the CUDA vendor is checked."""
from __future__ import annotations

import json
import re
import shutil
import subprocess
import sys
import time
import urllib.parse
import urllib.request
from pathlib import Path

import pytest

from otel_gpu.demo.runner import free_port
from tests.bpf.targets.hip_http import find_hip
from tests.bpf.test_hip_calls import kernels_library as hip_kernels
from tests.bpf.test_nccl_collectives import _stub as stub_libnccl
from tests.bpf.test_reliability_bad_input import _send_and_close
from tests.harness import ROOT, TARGETS, Target, server_spans

DASHBOARD = json.loads((ROOT / "k8s/grafana/otel-gpu-dashboard.json").read_text())
# Grafana's own variables, as it would fill them for a 5-minute view scraped every second.
GRAFANA = {"$__rate_interval": "1m", "$__range": "5m", "$service": ".*"}
NO_DATA_HERE = {"Live cudaMalloc / hipMalloc bytes by service": "no GPU driver: every allocation fails, none is live"}
SCRAPE_S = 1
# The services of each vendor's metrics (gpu.cuda.*, gpu.hip.*), by OTEL_SERVICE_NAME.
SERVICES = {"cuda": "dashboard-cuda", "hip": "dashboard-hip"}
VENDOR_METRIC = re.compile(r"\bgpu_(?:cuda|hip)_\w+")


class Prometheus:
    """Debian's prometheus on 127.0.0.1, scraping `target` every second, its data in `home`."""

    def __init__(self, home: Path, target: str) -> None:
        config = home / "prometheus.yml"
        config.write_text(f"global: {{scrape_interval: {SCRAPE_S}s, evaluation_interval: {SCRAPE_S}s}}\n"
                          "scrape_configs:\n  - job_name: otel-gpu\n"
                          f"    static_configs: [{{targets: ['{target}']}}]\n")
        self.port = free_port()
        self.log = open(home / "prometheus.log", "w")
        self.proc = subprocess.Popen(["prometheus", f"--config.file={config}", f"--storage.tsdb.path={home / 'data'}",
                                      f"--web.listen-address=127.0.0.1:{self.port}", "--log.level=warn"],
                                     stdout=self.log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 30
        while time.monotonic() < deadline:
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/-/ready", timeout=2)
                return
            except OSError:
                time.sleep(0.2)
        self.stop()
        raise RuntimeError("prometheus not ready:\n" + (home / "prometheus.log").read_text())

    def api(self, path: str, **params) -> dict:
        url = f"http://127.0.0.1:{self.port}/api/v1/{path}?{urllib.parse.urlencode(params, doseq=True)}"
        try:
            body = urllib.request.urlopen(url, timeout=10).read()
        except urllib.error.HTTPError as e:  # a bad query answers 400 with the error in JSON
            body = e.read()
        return json.loads(body)

    def query(self, expr: str) -> list:
        out = self.api("query", query=expr)
        assert out["status"] == "success", (expr, out.get("error"))
        return out["data"]["result"]

    def stop(self) -> None:
        self.proc.terminate()
        try:
            self.proc.wait(10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
        self.log.close()


def grafana(expr: str, service: str = ".*") -> str:
    """`expr` as Grafana sends it; `service`: the $service variable's value (a regex)."""
    for var, value in {**GRAFANA, "$service": service}.items():
        expr = expr.replace(var, value)
    return expr


GARBAGE = bytes(range(1, 256)).replace(b"\n", b"\x00") * 8  # no protocol the collector knows: a counted drop


@pytest.fixture
def prometheus(tmp_path):
    if shutil.which("prometheus") is None:
        pytest.skip("prometheus is not installed (scripts/setup.sh installs Debian's)")
    started = []
    yield lambda target: started.append(Prometheus(tmp_path, target)) or started[-1]
    for p in started:
        p.stop()


def legend_failures(title: str, series: list, legend: set) -> list:
    """A series without a label its legend shows."""
    return [f"{title}: a series without {sorted(missing)}: {s['metric']}" for s in series
            if (missing := {k for k in legend if not s["metric"].get(k)})]


def test_every_dashboard_query_returns_series_with_its_legend_labels(tmp_path, receiver, start_collector,
                                                                      start_target, targets, prometheus):
    port = free_port()
    collector = start_collector("--prometheus-port", str(port), "--gpu-price", "3.6")  # the time split's panel too: on by default
    prom = prometheus(f"127.0.0.1:{port}")

    def start(*args) -> Target:  # stopped at the test's end, whatever happens (the targets fixture)
        targets.append(Target(*args))
        return targets[-1]
    cuda = start_target(env={"OTEL_SERVICE_NAME": SERVICES["cuda"]})
    stream = start([sys.executable, str(TARGETS / "async_servers.py"), "starlette-stream", "0"])
    nccl = start([sys.executable, str(TARGETS / "nccl_http.py")],
                 {"STUB_LIBNCCL": stub_libnccl(tmp_path, "libnccl.so.2")})
    hip = None
    if Path(find_hip()).exists():
        hip = start([sys.executable, str(TARGETS / "hip_http.py"), "stdlib", "0", hip_kernels(tmp_path)],
                    {"OTEL_SERVICE_NAME": SERVICES["hip"]})
    vendors = {"cuda", "hip"} if hip else {"cuda"}
    traffic = [t for t in (cuda, stream, nccl, hip) if t is not None]
    for t in traffic:
        collector.wait_traced(t.pid, 60)
        t.go()
    served = 0
    for i in range(3):
        cuda.get("/work?launches=4&copies=2&syncs=1")
        cuda.get("/cost?launches=1&hold_ms=30")
        stream.get(f"/infer?id={i + 1}&launches=3")
        nccl.get(f"/collect/{i + 1}")
        served += 4
        if hip is not None:  # copies, launches of four kernels, a graph launch, a sync
            assert hip.get(f"/infer/{i + 1}") == b"ok"
            served += 1
    _send_and_close(cuda.port, [GARBAGE])

    def counted() -> float:
        return sum(float(s["value"][1]) for s in prom.query("sum(http_server_request_duration_seconds_count)"))
    deadline = time.monotonic() + 60
    while time.monotonic() < deadline and counted() < served:
        time.sleep(SCRAPE_S)
    assert counted() >= served, [s.attributes.get("url.path") for t in traffic
                                 for s in server_spans(receiver.spans, t.pid)]
    time.sleep(3 * SCRAPE_S)  # rate() needs two samples after the traffic

    variable = DASHBOARD["templating"]["list"][0]
    selector, label = re.fullmatch(r"label_values\((.+),\s*(\w+)\)", variable["definition"]).groups()
    values = prom.api(f"label/{label}/values", **{"match[]": selector})["data"]
    assert {SERVICES[v] for v in vendors} <= set(values), f"variable {variable['name']}: {selector}: {values}"

    report, failed = [], []
    for panel in DASHBOARD["panels"]:
        for target in panel.get("targets", []):
            series = prom.query(grafana(target["expr"]))
            legend = set(re.findall(r"\{\{\s*(\w+)\s*\}\}", target.get("legendFormat", "")))
            report.append(f"{panel['title']}: {len(series)} series")
            if panel["title"] in NO_DATA_HERE:
                continue
            if not series:
                failed.append(f"{panel['title']}: no series for {target['expr']}")
            failed += legend_failures(panel["title"], series, legend)
            if "api" in legend and {s["metric"].get("api") for s in series} != vendors:
                failed.append(f"{panel['title']}: apis {sorted({s['metric'].get('api') for s in series})}")
            if not VENDOR_METRIC.search(target["expr"]):
                continue
            for vendor in vendors:  # the dashboard on one vendor's service
                alone = prom.query(grafana(target["expr"], SERVICES[vendor]))
                report.append(f"  $service={SERVICES[vendor]}: {len(alone)} series")
                if not alone:
                    failed.append(f"{panel['title']}: no series for the {vendor} service alone")
                failed += legend_failures(f"{panel['title']} ({vendor})", alone, legend)
                if "api" in legend and {s["metric"].get("api") for s in alone} != {vendor}:
                    failed.append(f"{panel['title']}: the {vendor} service's apis: "
                                  f"{sorted({s['metric'].get('api') for s in alone})}")
    print("\n".join(report))
    assert not failed, failed
