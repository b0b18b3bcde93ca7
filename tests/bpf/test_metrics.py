"""GPU metrics from a real traced process, scraped from the Prometheus endpoint."""
from __future__ import annotations

import re
import time
import urllib.request

from otel_gpu.demo.runner import free_port
from tests.harness import server_spans


def _scrape(port: int) -> str:
    return urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()


def _value(text: str, metric: str, **labels) -> float:
    total = 0.0
    for line in text.splitlines():
        if not line.startswith(metric + "{"):
            continue
        if all(f'{k}="{v}"' in line for k, v in labels.items()):
            total += float(line.rsplit(" ", 1)[1])
    return total


def test_prometheus_metrics_count_launches_bytes_and_requests(receiver, start_collector, start_target):
    port = free_port()
    collector = start_collector("--prometheus-port", str(port), "--gpu-price", "3.6")
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    for _ in range(3):
        target.get("/work?launches=4&copies=2&h2d=1000&d2h=10")
    target.get("/cost?launches=1&hold_ms=30")
    assert receiver.wait_for(lambda s: len([x for x in server_spans(s, target.pid)
                                            if x.attributes["url.path"] in ("/work", "/cost")]) >= 4)
    deadline = time.monotonic() + 10
    text = ""
    while time.monotonic() < deadline:  # the metrics stage runs right after export
        text = _scrape(port)
        if _value(text, "gpu_cuda_kernel_launch_calls_total", http_route="/work") >= 12:
            break
        time.sleep(0.2)
    kernel = "matmul_tile(float const*, float const*, float*, int)"
    assert _value(text, "gpu_cuda_kernel_launch_calls_total", http_route="/work", gpu_kernel_name=kernel) == 12
    assert _value(text, "gpu_cuda_memory_copies_bytes_sum", http_route="/work", cuda_memcpy_kind="HostToDevice") == 3000
    assert _value(text, "gpu_cuda_memory_copies_bytes_count", http_route="/work", cuda_memcpy_kind="HostToDevice") == 3
    assert _value(text, "gpu_cuda_memory_copies_bytes_sum", http_route="/work", cuda_memcpy_kind="DeviceToHost") == 30
    assert _value(text, "http_server_request_duration_seconds_count", http_route="/work") == 3
    assert _value(text, "gpu_cuda_kernel_block_size_count", http_route="/work") == 12
    assert _value(text, "otel_gpu_cost_gpu_seconds_total", otel_gpu_feature="/cost") > 0.025
    assert _value(text, "otel_gpu_cuda_calls_total", otel_gpu_attribution="thread") >= 12 + 6 + 2
    assert re.search(r"^otel_gpu_events_lost_total(\{[^}]*\})? 0", text, re.M)


def test_metrics_go_out_over_otlp_too(receiver, start_collector, start_target):
    collector = start_collector(OTEL_METRIC_EXPORT_INTERVAL="500")
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    target.get("/work?launches=2&copies=1")
    assert collector.stop() == 0  # shutdown flushes the last metrics
    assert {"gpu.cuda.kernel.launch.calls", "gpu.cuda.memory.copies", "http.server.request.duration",
            "otel_gpu.cuda.calls"} <= receiver.metric_names
