"""gpu.device.uuid and gpu.device.model on a real request's server span: the collector
reads a FAKE NVIDIA driver procfs (OTEL_GPU_NVIDIA_PROCFS; no GPU here) and the real
target's environment (PCI bus order, CUDA_VISIBLE_DEVICES=1: the second GPU by bus)."""
from __future__ import annotations

from tests.harness import server_spans
from tests.unit.test_gpu_devices import H100_A, H100_B, L4, fake_driver


def test_server_span_names_its_physical_gpu(tmp_path, receiver, start_collector, start_target):
    driver = fake_driver(tmp_path / "driver", H100_A, H100_B, L4)  # bus order: H100_B, H100_A, L4
    collector = start_collector(OTEL_GPU_NVIDIA_PROCFS=driver)
    target = start_target(env={"CUDA_DEVICE_ORDER": "PCI_BUS_ID", "CUDA_VISIBLE_DEVICES": "1"})
    collector.wait_traced(target.pid)
    target.go()
    target.get("/work?launches=2")
    work = lambda spans: [x for x in server_spans(spans, target.pid) if x.attributes.get("url.path") == "/work"]
    assert receiver.wait_for(work, 60), collector.log.lines
    [span] = work(receiver.spans)
    assert span.attributes["gpu.launches"] == 2
    assert span.attributes["gpu.device"] == 0
    assert span.attributes["gpu.device.uuid"] == H100_A[2]
    assert span.attributes["gpu.device.model"] == H100_A[1]
    # /nothing (go's probe) made no CUDA call: no device, so no identity either
    assert not any("gpu.device.uuid" in x.attributes for x in server_spans(receiver.spans, target.pid) if x is not span)
