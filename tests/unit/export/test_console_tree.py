"""render_tree: one block per trace, kernel names and tree glyphs."""
import io
import random

from opentelemetry.sdk.resources import Resource

from otel_gpu.clock import BpfClock
from otel_gpu.export.console import ConsoleTreeExporter, render_tree
from otel_gpu.export.spans import SpanBuilder
from otel_gpu.pipeline.events import CALL_LAUNCH_KERNEL, CALL_MEMCPY, CudaCall
from otel_gpu.pipeline.http_parser import RequestHead
from otel_gpu.pipeline.model import CallSink, Request
from otel_gpu.pipeline.routes import RouteTemplater

KERNEL = "vector_add(float const*, float*, int)"


def spans():
    sink = CallSink(256)
    for i, (kind, nbytes, direction) in enumerate([(CALL_MEMCPY, 4096, 1), (CALL_LAUNCH_KERNEL, 0, 0),
                                                   (CALL_MEMCPY, 4096, 2)]):
        sink.add(CudaCall(1, 1, 1000 + i * 100, kind, 0, 0x40, (4, 1, 1), (256, 1, 1), 0, 0,
                          nbytes, direction, 50), "thread")
    r = Request(1, 1, 5, RequestHead("POST", "/infer/7", "1.1"), 900, 0xFEED, 0xBEEF, sink,
                end_ns=2_000_900, status=200)
    b = SpanBuilder(BpfClock(), RouteTemplater(), lambda pid: Resource({"service.name": "demo"}),
                    lambda pid, func: KERNEL, ids=random.Random(0))
    return b.build(r)


def test_render_tree():
    out = render_tree(spans())
    lines = out.splitlines()
    assert lines[0] == f"[demo] trace {0xFEED:032x}"
    assert lines[1].startswith("POST /infer/{id}  2.000 ms") and "status_code=200" in lines[1]
    assert lines[2].startswith("├─ cudaMemcpy") and "direction=h2d" in lines[2]
    assert lines[3].startswith("├─ cudaLaunchKernel") and KERNEL in lines[3] and "grid=4x1x1" in lines[3]
    assert lines[4].startswith("└─ cudaMemcpy") and "direction=d2h" in lines[4]
    assert len(lines) == 5


def test_render_tree_orders_children_by_start_and_survives_shuffling():
    s = spans()
    assert render_tree(list(reversed(s))) == render_tree(s)


def test_orphans_are_roots():
    s = spans()
    out = render_tree(s[1:])  # server span missing: each child is its own root block
    assert out.count("[demo] trace") == 3


def test_exporter_writes_and_skips_empty():
    buf = io.StringIO()
    exp = ConsoleTreeExporter(buf)
    exp.export([])
    assert buf.getvalue() == ""
    exp.export(spans())
    assert KERNEL in buf.getvalue() and buf.getvalue().endswith("\n\n")
