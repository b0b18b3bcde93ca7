"""Span attributes that always encode: ints outside int64 clamped and flagged, values
the probes could not read left out and flagged, through the real OTLP encoder."""
from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.sdk.resources import Resource

from otel_gpu import semconv as sc
from otel_gpu.clock import BpfClock
from otel_gpu.export.call_attributes import call_attributes
from otel_gpu.export.spans import INT64_MAX, SpanBuilder, int64_safe
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.model import CallSink, Request
from tests.unit.pipeline.calls import cuda


def _encoded_attrs(span) -> dict:
    proto = encode_spans([span])
    s = proto.resource_spans[0].scope_spans[0].spans[0]
    return {kv.key: kv.value for kv in s.attributes}


def test_ints_past_int64_are_clamped_and_flagged():
    attrs = int64_safe({"a": 2**64 - 1, "b": 5, "c": -2**70, "d": True, "e": [1, 2]})
    assert attrs == {"a": INT64_MAX, "b": 5, "c": -2**63, "d": True, "e": [1, 2], sc.GPU_VALUE_CLAMPED: True}
    assert sc.GPU_VALUE_CLAMPED not in int64_safe({"a": INT64_MAX})


def test_a_huge_memcpy_is_exported_clamped_on_call_and_server_spans(caplog):
    r = Request(1, 1, 3, RequestHead("GET", "/x", "1.1", {}), 1_000, 11, 12, CallSink(8), end_ns=2_000)
    r.sink.add(cuda("cudaMemcpy", nbytes=2**64 - 1, kind=1), "thread")
    r.resource, r.route = Resource({}), "/x"
    server, child = SpanBuilder(BpfClock()).build(r)
    for span, key in ((server, sc.GPU_MEMCPY_H2D_BYTES), (child, sc.GPU_MEMCPY_BYTES)):
        got = _encoded_attrs(span)
        assert got[key].int_value == INT64_MAX and got[sc.GPU_VALUE_CLAMPED].bool_value
    assert "Traceback" not in caplog.text and not [r for r in caplog.records if r.levelname == "ERROR"]


def test_unreadable_launch_config_says_so_and_exports_no_dims():
    c = cuda("cudaLaunchKernelExC", grid=(0, 0, 0), block=(0, 0, 0))
    assert call_attributes(c, {})[sc.GPU_GRID] == [0, 0, 0]  # read fine: a real value
    c.unreadable = True
    attrs = call_attributes(c, {})
    assert attrs[sc.GPU_ARGS_UNREADABLE] is True
    assert not {sc.GPU_GRID, sc.GPU_BLOCK, sc.GPU_SHARED_MEMORY_BYTES, sc.GPU_STREAM} & set(attrs)
    assert attrs[sc.GPU_KERNEL_FUNC] == hex(c.func)


def test_unreadable_memcpy_keeps_its_bytes_not_its_direction():
    c = cuda("cudaMemcpy2DAsync", nbytes=64, kind=1)
    c.unreadable = True
    attrs = call_attributes(c, {})
    assert attrs[sc.GPU_MEMCPY_BYTES] == 64 and attrs[sc.GPU_ARGS_UNREADABLE] is True
    assert sc.GPU_MEMCPY_DIRECTION not in attrs
