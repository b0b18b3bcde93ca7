"""SpanEncoder writes the message the SDK's own encoder builds, field for field, for
every kind of value, span part and grouping the exporter can be handed; the exporter
that uses it delivers to a real gRPC receiver."""
from __future__ import annotations

from opentelemetry.exporter.otlp.proto.common.trace_encoder import encode_spans
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceRequest
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import Event, ReadableSpan
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.sdk.util import BoundedList
from opentelemetry.sdk.util.instrumentation import InstrumentationScope
from opentelemetry.attributes import BoundedAttributes
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags, TraceState

from otel_gpu.export import otlp_encoding
from otel_gpu.export.otlp_encoding import GrpcSpanExporter, SpanEncoder
from otel_gpu.export.spans import SCOPE
from tests.support.otlp_receiver import OtlpReceiver

SAMPLED = TraceFlags(TraceFlags.SAMPLED)
RES_A = Resource({"service.name": "model", "k8s.pod.name": "pod-1", "process.pid": 42}, schema_url="https://x/1")
RES_B = Resource({"service.name": "front", "flag": True})
SCOPED = InstrumentationScope("other", "2.0", "https://scope", {"scope.attr": "v"})

EVERY_VALUE = {
    "s": "text", "empty": "", "unicode": "naïve 名前", "t": True, "f": False, "zero": 0, "neg": -5,
    "min": -2**63, "max": 2**63 - 1, "big": 300_000, "float": 2.5, "fzero": 0.0, "negf": -1e-300,
    "bytes": b"\x00\xff", "strs": ["a", "", "b"], "ints": [1, -1, 2**40], "tuple": (1.5, 2.5),
    "bools": [True, False], "nothing": [], "map": {"a": 1, "b": ["x"]}, "none": None,
    "kind": SpanKind.SERVER.value,
}


def _ctx(trace_id: int, span_id: int, remote: bool = False, state=None) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote, trace_flags=SAMPLED, trace_state=state)


def spans() -> list[ReadableSpan]:
    server_ctx = _ctx(0xABCDEF0123456789ABCDEF0123456789, 0x1122334455667788, state=TraceState([("k", "v"), ("a", "b")]))
    bounded = BoundedAttributes(maxlen=2, attributes={"a": 1, "b": 2, "c": 3})
    return [
        ReadableSpan(name="GET /items/{id}", context=server_ctx, parent=_ctx(7, 8, remote=True), resource=RES_A,
                     kind=SpanKind.SERVER, attributes=EVERY_VALUE, start_time=1_700_000_000_000_000_000,
                     end_time=1_700_000_000_123_456_789, status=Status(StatusCode.ERROR, "CUDA error 2"),
                     instrumentation_scope=SCOPE),
        ReadableSpan(name="cudaLaunchKernel", context=_ctx(server_ctx.trace_id, 3), parent=server_ctx,
                     resource=RES_A, kind=SpanKind.INTERNAL, attributes={"gpu.grid": [1, 2, 3], "thread.id": 9},
                     start_time=5, end_time=6, status=Status(StatusCode.UNSET), instrumentation_scope=SCOPE),
        ReadableSpan(name="GPU work, shared by requests", context=_ctx(11, 12), resource=RES_B,
                     kind=SpanKind.INTERNAL, attributes=bounded, status=Status(StatusCode.OK),
                     links=BoundedList.from_seq(1, [Link(_ctx(13, 14, remote=True), {"rule": "overlap"}),
                                                    Link(_ctx(15, 16))]),
                     events=[Event("note", {"n": 1}, timestamp=99), Event("bare", timestamp=0)],
                     instrumentation_scope=SCOPE),
        ReadableSpan(name="", context=_ctx(21, 22), resource=RES_A, kind=SpanKind.CLIENT,
                     instrumentation_scope=SCOPED),
        ReadableSpan(name="no scope", context=_ctx(31, 32), resource=RES_B, kind=SpanKind.PRODUCER,
                     links=[Link(_ctx(33, 34))], start_time=0, end_time=None),
        ReadableSpan(name="consumer", context=_ctx(41, 42), resource=RES_A, kind=SpanKind.CONSUMER,
                     attributes={"s": "text", "t": 1, "u": "1"}, instrumentation_scope=SCOPE),
    ]


def _same(ours: bytes, sdk) -> None:
    mine = ExportTraceServiceRequest.FromString(ours)
    assert mine == sdk
    assert mine.SerializeToString(deterministic=True) == sdk.SerializeToString(deterministic=True)


def test_every_part_of_a_span_as_the_sdk_encodes_it():
    batch = spans()
    _same(SpanEncoder().encode(batch), encode_spans(batch))


def test_a_kept_pair_is_only_reused_for_the_same_key_type_value_and_field():
    """True, 1 and "1" are equal or alike in Python, not on the wire; the same pair is a
    different field in a resource, a span and a link."""
    encoder = SpanEncoder()
    first = encoder.encode(spans())
    ctx = _ctx(1, 2)
    res = Resource({"x": True})
    mixed = [ReadableSpan(name=f"s{i}", context=ctx, resource=res, attributes={"x": v},
                          links=[Link(ctx, {"x": v})]) for i, v in enumerate((True, 1, "1", 1.0, False, 0, [1, 0], [True, False], (1, 0), [1.0]))]
    for _ in range(2):  # the second time from the kept bytes
        assert encoder.encode(spans()) == first
        _same(encoder.encode(mixed), encode_spans(mixed))


def test_kept_pairs_are_bounded(monkeypatch):
    monkeypatch.setattr(otlp_encoding, "PAIR_CACHE_MAX", 8)
    encoder = SpanEncoder()
    batch = [ReadableSpan(name="x", context=_ctx(1, i + 1), resource=RES_A, attributes={"thread.id": i})
             for i in range(50)]
    _same(encoder.encode(batch), encode_spans(batch))
    assert len(encoder._pairs) <= 8


def test_a_value_the_sdk_cannot_encode_is_left_out_as_it_does(caplog):
    batch = [ReadableSpan(name="x", context=_ctx(1, 2), resource=RES_A,
                          attributes={"ok": 1, "object": object(), "huge": 2**64, "list": [1, object()]})]
    encoder = SpanEncoder()

    def ours() -> str:
        return " ".join(r.getMessage() for r in caplog.records if r.name == otlp_encoding.__name__)
    _same(encoder.encode(batch), encode_spans(batch))
    assert "object" in ours() and "huge" in ours()
    caplog.clear()
    _same(encoder.encode(batch), encode_spans(batch))  # said once per name, not per span
    assert ours() == ""


def test_the_exporter_delivers_what_the_sdk_exporter_delivers():
    sdk_receiver, ours = OtlpReceiver(), OtlpReceiver()
    ours.server.start()
    try:
        exporter = GrpcSpanExporter(endpoint=f"127.0.0.1:{ours.port}", insecure=True)
        assert isinstance(exporter, OTLPSpanExporter)
        assert exporter.export(spans()) == SpanExportResult.SUCCESS
        exporter.shutdown()
    finally:
        ours.server.stop(0)
    sdk_receiver.keep(encode_spans(spans()))
    assert ours.spans == sdk_receiver.spans and len(ours.spans) == len(spans())
