"""The Grafana dashboard (k8s/grafana/otel-gpu-dashboard.json) queries only metrics and
labels the collector exports. The exported names come from the real path: the metrics
stage (GpuMetrics) with the SDK MeterProvider and the real Prometheus exporter, fed a
batch of records that exercises every instrument; the Prometheus text it serves is
parsed with prometheus_client's own parser, so `_total`, unit suffixes and dots to
underscores are the exporter's, not guessed here.

Both vendors: the metrics that name the API are gpu.cuda.* for CUDA calls and gpu.hip.*
for HIP calls (ApiMetrics); a query that reads one reads its twin, each vendor's series
tagged with its own `api` label (see test_each_vendors_series_are_kept_apart_by_an_api_label)."""
import ast
import json
import re
from pathlib import Path
from typing import NamedTuple

import pytest
from opentelemetry.exporter.prometheus import PrometheusMetricReader
from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.resources import Resource
from prometheus_client import CollectorRegistry, generate_latest
from prometheus_client.parser import text_string_to_metric_families

from otel_gpu import semconv as sc
from otel_gpu.cuda_calls import API_CUDA, API_HIP
from otel_gpu.export import metrics as metrics_module
from otel_gpu.export.metrics import GpuMetrics
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.model import CallSink, ProcessWindow, Request
from otel_gpu.probes.attacher import ProbeCounts
from otel_gpu.ratelimit import Stats
from tests.unit.pipeline.calls import cuda

ROOT = Path(__file__).resolve().parents[3]
DASHBOARD = json.loads((ROOT / "k8s/grafana/otel-gpu-dashboard.json").read_text())
PID = 41


def _request(n, path, calls):
    r = Request(PID, 1, 3, RequestHead("GET", path, "1.1", {}), 1_000, trace_id=n, span_id=n,
                sink=CallSink(8), end_ns=3_000_000, status=200)
    for c in calls:
        r.sink.add(c, "thread")
    r.resource, r.route, r.feature = Resource({sc.SERVICE_NAME: "svc"}), path, path
    r.kernel_names = {0x1000: "gemm(float*)"}
    r.gpu_seconds, r.cost = 0.002, 0.0001
    r.chunks = 3  # a streamed response
    return r


def _batch():
    """Requests with every call category the instruments count, and an ambiguous and an
    outside window with GPU time (split and outside cost)."""
    calls = [cuda(pid=PID), cuda("cudaMemcpy", pid=PID, nbytes=4096, kind=1),
             cuda("cudaMemcpy", pid=PID, nbytes=64, kind=2), cuda("cudaMalloc", pid=PID, func=0xA0, nbytes=1 << 20),
             cuda("cudaDeviceSynchronize", pid=PID, duration=500_000), cuda("ncclAllReduce", pid=PID, nbytes=256),
             cuda("cudaGraphLaunch", pid=PID, func=0xB0)]
    calls[-1].kernels = ((0x1000, 3),)  # what the graph runs, from its capture
    a, b = _request(1, "/infer", calls), _request(2, "/embed", calls[:1])
    a.time_split = (1_000_000, 200_000, 1_500_000, 300_000)  # where its time went (pipeline/time_split.py)
    ambiguous = ProcessWindow(PID, "ambiguous", 0, 10, CallSink(8), candidates=[(1, 1), (2, 2)])
    ambiguous.sink.add(cuda(pid=PID, tid=9), "ambiguous")
    ambiguous.split, ambiguous.split_features = {(1, 1): 0.001, (2, 2): 0.001}, {(1, 1): "/infer", (2, 2): "/embed"}
    outside = ProcessWindow(PID, "outside", 0, 10, CallSink(8))
    outside.sink.add(cuda(pid=PID, tid=9), "outside")
    for w in (ambiguous, outside):
        w.resource, w.gpu_seconds, w.cost = a.resource, 0.002, 0.0001
    # A HIP service's request: the gpu.hip.* twins, with hip.memcpy.kind and hip.device.index.
    hip_calls = [cuda("hipLaunchKernel", pid=PID), cuda("hipMemcpyHtoD", pid=PID, nbytes=4096, kind=1),
                 cuda("hipMemcpyAsync", pid=PID, nbytes=64, kind=2),
                 cuda("hipMalloc", pid=PID, func=0xC0, nbytes=1 << 20), cuda("hipGraphLaunch", pid=PID, func=0xD0),
                 cuda("hipStreamSynchronize", pid=PID, duration=500_000)]
    hip = _request(3, "/hip", hip_calls)
    for c in hip_calls:
        hip.busy.add(c, 0)
    probes = ProbeCounts({"cudaLaunchKernel": 1}, {"cuLaunchKernel": 1})
    return [a, b, hip, ambiguous, outside, probes]


@pytest.fixture(scope="module")
def exported():
    """{Prometheus sample name: label names} and the OTel metric names, from one collection."""
    registry, memory = CollectorRegistry(), InMemoryMetricReader()
    stats = Stats()
    stats.add("lost_events", 3)
    gpu = GpuMetrics([PrometheusMetricReader(registry=registry), memory], stats)
    gpu.process(_batch())
    gpu.costs().process(_batch())
    otel_names = {m.name for rm in memory.get_metrics_data().resource_metrics
                  for sm in rm.scope_metrics for m in sm.metrics}
    samples = {}
    for family in text_string_to_metric_families(generate_latest(registry).decode()):
        for s in family.samples:
            samples.setdefault(s.name, set()).update(s.labels)
    gpu.shutdown()
    return samples, otel_names


def _instruments():
    """Every instrument metrics.py creates: the first argument of each meter.create_*() and
    histograms.create() (export/histograms.py); an f-string over `api` (ApiMetrics) is
    one instrument per API."""
    tree = ast.parse(Path(metrics_module.__file__).read_text())
    out = set()
    for node in ast.walk(tree):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)
                and node.func.attr.startswith("create") and node.args):
            continue
        name = node.args[0]
        if isinstance(name, ast.Constant):
            out.add(name.value)
        elif isinstance(name, ast.JoinedStr):
            for api in (API_CUDA, API_HIP):
                out.add("".join(v.value if isinstance(v, ast.Constant) else {"api": api}[v.value.id]
                                for v in name.values))
    return out


# --- PromQL: the names an expression uses ---------------------------------------------------

KEYWORDS = {"by", "without", "on", "ignoring", "group_left", "group_right", "bool", "and", "or", "unless",
            "offset", "inf", "nan"}


STRING = r'"(?:[^"\\]|\\.)*"'


class LabelReplace(NamedTuple):
    """label_replace(v, "dst", "replacement", "src", "regex") at expr[start:end]; src is ""
    for a constant label."""
    dst: str
    replacement: str
    src: str
    start: int
    end: int


def label_replaces(expr: str) -> list[LabelReplace]:
    """Every label_replace() of an expression, nested ones included."""
    out, opened, i = [], [], 0
    while i < len(expr):
        if expr[i] == '"':  # a string's parentheses are not the expression's
            i += re.match(STRING, expr[i:]).end()
            continue
        if expr[i] == "(":
            opened.append((expr.endswith("label_replace", 0, i), i))
        elif expr[i] == ")":
            is_label_replace, start = opened.pop()
            if is_label_replace:  # its own four strings are the last ones before its ")"
                dst, replacement, src, _ = (a[1:-1] for a in re.findall(STRING, expr[start:i])[-4:])
                out.append(LabelReplace(dst, replacement, src, start, i + 1))
        i += 1
    return out


def promql_names(expr: str) -> tuple[set, set]:
    """(metric names, label names) an expression refers to. Strings, Grafana variables,
    range/offset durations, function names and keywords are not metrics. A label that a
    label_replace() makes is not one the metrics must have; the label it reads is."""
    replaced = label_replaces(expr)
    labels = {r.src for r in replaced if r.src}
    body = re.sub(STRING, '""', expr)
    for block in re.findall(r"\{([^}]*)\}", body):
        labels |= set(re.findall(r"([A-Za-z_]\w*)\s*(?:=~|!~|!=|=)", block))
    for group in re.findall(r"\b(?:by|without|on|ignoring)\s*\(([^)]*)\)", body):
        labels |= {g.strip() for g in group.split(",") if g.strip()}
    body = re.sub(r"\{[^}]*\}|\[[^\]]*\]|\$\w+", " ", body)
    body = re.sub(r"\b(?:by|without|on|ignoring)\s*\([^)]*\)", " ", body)
    names = set()
    for m in re.finditer(r"(?<![\w.])([A-Za-z_:][\w:]*)(\s*\()?", body):
        if not m.group(2) and m.group(1).lower() not in KEYWORDS:
            names.add(m.group(1))
    return names, labels - {r.dst for r in replaced}


def test_promql_names_finds_metrics_and_labels_and_nothing_else():
    names, labels = promql_names(
        'histogram_quantile(0.95, sum by (le, http_route) (rate(a_bucket{service_name=~"$service",x="y{z}"}'
        '[$__rate_interval]))) / on (job) sum(b_total offset 5m) * 3600')
    assert names == {"a_bucket", "b_total"}
    assert labels == {"le", "http_route", "service_name", "x", "job"}
    # label_replace(): the label it reads is used, the one it makes is not the metrics'
    names, labels = promql_names(
        'sum by (kind, api) (label_replace(label_replace(rate(a_sum{s="x"}[1m]), "kind", "$1", "a_kind", "(.*)"), '
        '"api", "a", "", "") or label_replace(rate(b_sum[1m]), "api", "b(", "", ""))')
    assert names == {"a_sum", "b_sum"}
    assert labels == {"s", "a_kind"}


def _queries():
    """(panel title, expression) for every query of the dashboard, the variables' included."""
    out = [(p["title"], t["expr"]) for p in DASHBOARD["panels"] for t in p.get("targets", [])]
    for v in DASHBOARD["templating"]["list"]:
        out.append((f"variable {v['name']}", re.fullmatch(r"label_values\((.+)\)", v["definition"]).group(1)))
    return out


def variable_metrics(selector: str, known) -> set:
    """The metrics of `known` that a label_values() selector matches: a metric name, or
    {__name__=~"regex"} (Prometheus anchors the regex)."""
    if re.fullmatch(r"[A-Za-z_:][\w:]*", selector):
        return {selector} & set(known)
    rx = re.fullmatch(r'\{\s*__name__\s*=~\s*"([^"]+)"\s*\}', selector).group(1)
    return {n for n in known if re.fullmatch(rx, n)}


# --- both vendors: gpu.cuda.* and gpu.hip.* (ApiMetrics) ----------------------------------------

VENDORS = {"cuda": "hip", "hip": "cuda"}
VENDOR_METRIC = re.compile(r"\bgpu_(cuda|hip)_\w+")


def twin(name: str) -> str | None:
    """gpu_cuda_X <-> gpu_hip_X, cuda_X <-> hip_X (labels: cuda_memcpy_kind, cuda_device_index);
    None for a name of neither vendor."""
    m = re.fullmatch(r"(gpu_)?(cuda|hip)(_\w+)", name)
    return f"{m.group(1) or ''}{VENDORS[m.group(2)]}{m.group(3)}" if m else None


def untwinned(expr: str) -> set:
    """The vendor metrics and labels an expression reads without their other vendor's twin."""
    names, labels = promql_names(expr)
    used = names | labels
    return {n for n in used if twin(n) and twin(n) not in used}


def untagged(expr: str) -> list:
    """Where an expression reads a vendor metric outside a label_replace() that tags it with
    its own api ("cuda" or "hip"), and any __name__ matcher. rate() drops the metric name, so
    a CUDA and a HIP series of one service with the same labels (a process using both, or
    two without device labels) become one label set: rate({__name__=~"gpu_(cuda|hip)_..."})
    fails with "vector cannot contain metrics with the same labelset", and `a or b` drops
    b's series (both seen on Prometheus 2.42). Tagged with api, they stay apart."""
    tags = [r for r in label_replaces(expr) if r.dst == "api" and not r.src]
    out = [m.group(0) for m in VENDOR_METRIC.finditer(expr)
           if not any(r.replacement == m.group(1) and r.start < m.start() < r.end for r in tags)]
    return out + (["__name__"] if "__name__" in expr else [])


# --- the checks -------------------------------------------------------------------------------


def test_the_batch_exercises_every_instrument(exported):
    samples, otel_names = exported
    assert _instruments() <= otel_names, _instruments() - otel_names
    assert "otel_gpu_events_lost_total" in samples and "gpu_memory_allocated_bytes" in samples


def test_every_dashboard_query_uses_only_exported_metrics_and_their_labels(exported):
    samples, _ = exported
    for title, expr in _queries():
        if title.startswith("variable"):  # label_values(metric or selector, label)
            selector, _, label = (x.strip() for x in expr.rpartition(","))
            metrics = variable_metrics(selector, samples)
            assert metrics, (title, selector)
            for metric in metrics:
                assert label in samples[metric], (title, metric, label)
            continue
        names, labels = promql_names(expr)
        assert names, (title, expr)
        missing = names - samples.keys()
        assert not missing, f"{title}: {sorted(missing)} not exported (exported: {sorted(samples)})"
        known = set().union(*(samples[n] for n in names))
        assert labels <= known, f"{title}: labels {sorted(labels - known)} on none of {sorted(names)}"


def test_every_panel_has_a_query_on_an_exported_metric(exported):
    samples, _ = exported
    for panel in DASHBOARD["panels"]:
        if panel["type"] == "row":
            continue
        assert any(promql_names(t["expr"])[0] & samples.keys() for t in panel["targets"]), panel["title"]


@pytest.mark.parametrize("topic,metric", [
    ("cost per route", "otel_gpu_cost_amount_total"), ("GPU seconds", "otel_gpu_cost_gpu_seconds_total"),
    ("launches by kernel", "gpu_cuda_kernel_launch_calls_total"),
    ("memcpy bytes", "gpu_cuda_memory_copies_bytes_sum"),
    ("HIP launches by kernel", "gpu_hip_kernel_launch_calls_total"),
    ("HIP memcpy bytes", "gpu_hip_memory_copies_bytes_sum"),
    ("HIP launch shape", "gpu_hip_kernel_grid_size_bucket"),
    ("sync time", "gpu_sync_duration_seconds_sum"), ("attribution outcomes", "otel_gpu_cuda_calls_total"),
    ("events lost", "otel_gpu_events_lost_total"), ("drops by reason", "otel_gpu_drops_total"),
    ("NCCL bytes", "gpu_nccl_bytes_total"), ("NCCL calls", "gpu_nccl_calls_total")])
def test_the_dashboard_shows_each_topic_the_issue_names(topic, metric, exported):
    assert metric in exported[0], f"{topic}: {metric} is not what the exporter calls it"
    assert any(metric in promql_names(expr)[0] for _, expr in _queries()), topic


@pytest.mark.parametrize("metric", ["gpu_nccl_bytes_total", "gpu_nccl_calls_total"])
def test_nccl_panels_break_down_by_route_and_op_the_labels_the_metric_has(metric, exported):
    """The NCCL counters carry http_route and gpu_nccl_op (metrics.py): a panel groups by both."""
    assert {"http_route", "gpu_nccl_op", "service_name"} <= exported[0][metric]
    assert any(metric in names and {"http_route", "gpu_nccl_op"} <= labels
               for names, labels in (promql_names(expr) for _, expr in _queries())), metric


def test_a_wrong_name_is_caught(exported):
    """The check can fail: names without the exporter's suffixes, or with a doubled one."""
    samples, _ = exported
    for wrong in ("gpu_cuda_kernel_launch_calls", "gpu_sync_duration_bucket", "gpu_cuda_memory_copies_sum"):
        assert promql_names(f"sum(rate({wrong}[5m]))")[0] == {wrong}
        assert wrong not in samples


def test_every_query_on_a_vendor_metric_reads_its_twin_too(exported):
    """A panel (and the $service variable) that reads a gpu_cuda_ metric reads its gpu_hip_
    twin, and a cuda_ label (cuda_memcpy_kind) its hip_ one: one dashboard shows a CUDA
    service, a HIP service, or a node with both. The twins are exported (the batch has a
    HIP request)."""
    samples, _ = exported
    both = 0
    for title, expr in _queries():
        if title.startswith("variable"):
            metrics = variable_metrics(expr.rpartition(",")[0].strip(), samples)
            assert {twin(m) for m in metrics if twin(m)} <= metrics, (title, expr)
            continue
        assert not untwinned(expr), f"{title}: {sorted(untwinned(expr))} without the other vendor's: {expr}"
        both += any(n.startswith("gpu_hip_") for n in promql_names(expr)[0])
    assert both >= 5, "the launch, copy, launch-per-request and launch-shape queries read both vendors"
    for name in {n for n in samples if twin(n)}:
        assert twin(name) in samples, f"{name} exported, {twin(name)} not"


def test_each_vendors_series_are_kept_apart_by_an_api_label():
    for title, expr in _queries():
        if not title.startswith("variable"):
            assert not untagged(expr), f"{title}: {untagged(expr)} not tagged with its api: {expr}"


def test_a_query_of_one_vendor_or_of_untagged_vendors_is_caught():
    """The vendor checks can fail: a CUDA-only query, a HIP copy query grouped by the CUDA
    label, a __name__ regex, a bare `or`."""
    assert untwinned("sum(rate(gpu_cuda_kernel_launch_calls_total[5m]))") == {"gpu_cuda_kernel_launch_calls_total"}
    assert untwinned('sum by (cuda_memcpy_kind) (label_replace(rate(gpu_cuda_memory_copies_bytes_sum[5m]), "api", '
                     '"cuda", "", "") or label_replace(rate(gpu_hip_memory_copies_bytes_sum[5m]), "api", "hip", "", '
                     '""))') == {"cuda_memcpy_kind"}
    assert untagged('sum(rate({__name__=~"gpu_(cuda|hip)_kernel_launch_calls_total"}[5m]))') == ["__name__"]
    assert untagged("sum(rate(gpu_cuda_kernel_grid_size_bucket[5m]) or rate(gpu_hip_kernel_grid_size_bucket[5m]))") \
        == ["gpu_cuda_kernel_grid_size_bucket", "gpu_hip_kernel_grid_size_bucket"]
    # tagged, but as the other vendor
    assert untagged('label_replace(rate(gpu_hip_kernel_launch_calls_total[5m]), "api", "cuda", "", "")') \
        == ["gpu_hip_kernel_launch_calls_total"]
