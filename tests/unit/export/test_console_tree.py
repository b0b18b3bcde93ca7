"""render_tree (otel_gpu/span_tree.py): one block per trace, kernel names and tree
glyphs; the console exporter. Spans are built here, not by SpanBuilder, so the
drawing is tested alone."""
import io

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

from otel_gpu import semconv as sc
from otel_gpu.export.console import ConsoleTreeExporter
from otel_gpu.span_tree import render_tree

KERNEL = "vector_add(float const*, float*, int)"
TRACE = 0xFEED
RES = Resource({sc.SERVICE_NAME: "demo"})


def _ctx(span_id: int) -> SpanContext:
    return SpanContext(TRACE, span_id, False, TraceFlags(TraceFlags.SAMPLED))


def spans():
    server = ReadableSpan(name="POST /infer/{id}", context=_ctx(0xBEEF), resource=RES, kind=SpanKind.SERVER,
                          attributes={sc.HTTP_RESPONSE_STATUS_CODE: 200, sc.GPU_LAUNCHES: 1},
                          start_time=900, end_time=2_000_900)
    kids = [("cudaMemcpy", {sc.GPU_MEMCPY_BYTES: 4096, sc.GPU_MEMCPY_DIRECTION: "h2d"}),
            ("cudaLaunchKernel", {sc.GPU_KERNEL_NAME: KERNEL, sc.GPU_GRID: (4, 1, 1), sc.GPU_BLOCK: (256, 1, 1)}),
            ("cudaMemcpy", {sc.GPU_MEMCPY_BYTES: 4096, sc.GPU_MEMCPY_DIRECTION: "d2h"})]
    return [server] + [ReadableSpan(name=n, context=_ctx(i + 1), parent=server.context, resource=RES,
                                    attributes={sc.GPU_ATTRIBUTION: "thread", **a}, kind=SpanKind.INTERNAL,
                                    start_time=1000 + i * 100, end_time=1050 + i * 100)
                       for i, (n, a) in enumerate(kids)]


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


def _controls(text: str) -> list:
    return [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f)]


def test_console_neutralises_escape_sequences_in_spans_it_is_handed():
    """Defence in depth: spans are sanitised when built, and the tree again when drawn."""
    res = Resource({sc.SERVICE_NAME: "svc\x1b]0;pwned\x07"})
    server = ReadableSpan(name="GET /a\x1b[2J\x9b31m", context=_ctx(0xBEEF), resource=res, kind=SpanKind.SERVER,
                          attributes={sc.HTTP_RESPONSE_STATUS_CODE: 400}, start_time=0, end_time=1000)
    kid = ReadableSpan(name="cudaLaunchKernel", context=_ctx(1), parent=server.context, resource=res,
                       attributes={sc.GPU_KERNEL_NAME: "k\x1b[31m\x7f", sc.GPU_GRID: ("1\x1b", 1, 1)},
                       kind=SpanKind.INTERNAL, start_time=10, end_time=20)
    out = io.StringIO()
    ConsoleTreeExporter(out).export([server, kid])
    text = out.getvalue()
    assert not _controls(text), repr(text)
    assert "[svc\ufffd]0;pwned\ufffd]" in text and "GET /a\ufffd[2J\ufffd31m" in text
    assert "kernel.name=k\ufffd[31m\ufffd" in text and "grid=1\ufffdx1x1" in text
