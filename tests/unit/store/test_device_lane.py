"""Device-clock mode as a user of the store sees it: a request whose launches and copy the
device timed, through the real CostStage, SpanBuilder and StoreExporter; its spans carry the
device times, its cost says it came from the device, and the HTML waterfall draws each call's
device time on its own row, where the device ran it."""
import random

import pytest
from opentelemetry.sdk.resources import Resource

from otel_gpu import semconv as sc
from otel_gpu.clock import BpfClock
from otel_gpu.export.spans import SpanBuilder
from otel_gpu.pipeline.cost import CostStage, Prices
from otel_gpu.pipeline.model import CallSink, Request
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.store.html_report import _waterfall, _waterfall_rows, build_page
from otel_gpu.store.traces import trace_spans
from tests.unit.pipeline.calls import cuda

PID, US, BASE = 77, 1000, 10**12
TRACE = 0x4242


def timed_request() -> Request:
    """Three launches (grid x 1, 2, 3) and a copy; the device ran launch k for 10 * k us,
    starting 100 us after its call, and the copy for 40 us."""
    r = Request(PID, 1, 3, RequestHead("GET", "/infer", "1.1", {}), BASE, trace_id=TRACE, span_id=1,
                sink=CallSink(8), end_ns=BASE + 2000 * US, status=200)
    calls = [cuda(ts=BASE + k * 300 * US, grid=(k, 1, 1), ret=-1) for k in (1, 2, 3)]
    calls.append(cuda("cudaMemcpy", ts=BASE + 1200 * US, nbytes=4096, kind=1, ret=-1))
    for k, c in enumerate(calls, 1):
        start = c.ts_ns + 100 * US
        c.device_ns = ((start, start + (10 * k if k < 4 else 40) * US),)
        r.sink.add(c, "thread")
        r.busy.add(c, 0)
    r.device_busy = tuple(iv for c in calls for iv in c.device_ns)
    r.resource = Resource({sc.SERVICE_NAME: "svc", sc.PROCESS_PID: PID})
    r.route = "/infer"
    return r


def test_spans_store_and_waterfall_carry_the_device_times(store, reader):
    r = timed_request()
    (priced,) = CostStage(Prices("3.6", model=""), clock=lambda: 0.0).process([r])
    spans = SpanBuilder(BpfClock(), ids=random.Random(5)).build(priced)
    server = spans[0]
    assert server.attributes[sc.GPU_COST_SOURCE] == "device"
    assert server.attributes[sc.GPU_COST_SECONDS] == pytest.approx((10 + 20 + 30 + 40) * US / 1e9)
    store.export(spans)
    store.shutdown()
    rows = _waterfall_rows(trace_spans(reader(), f"{TRACE:032x}"), [])
    device = {r["text"]: r["device"] for r in rows if r["device"]}
    assert len(device) == 4
    for text, (start_ms, dur_ms) in device.items():
        row = next(x for x in rows if x["text"] == text)
        assert start_ms == pytest.approx(row["start_ms"] + 0.1)  # 100 us after its call entered
        k = int(text.split()[2].split("x")[0]) if text.startswith("cudaLaunchKernel") else 4
        assert dur_ms == pytest.approx((10 * k if k < 4 else 40) / 1000), text
    lane = [t for t in _waterfall(rows).data if t.name == "device"]
    assert len(lane) == 1 and len(lane[0].y) == 4
    assert "device µs" in build_page(reader(), trace_id=f"{TRACE:032x}")
