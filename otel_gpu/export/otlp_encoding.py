"""ReadableSpans -> OTLP ExportTraceServiceRequest, written as protobuf wire bytes.

The SDK's encoder (opentelemetry.exporter.otlp.proto.common encode_spans) builds a
message object per span, attribute and value: ~46 µs a span here, 42 % of the
collector's CPU at 100 % sampling (bench item 2). This writes the same message
(`tests/unit/export/test_otlp_encoding.py` holds it to the SDK's output) as bytes, with
the bytes of repeated attribute pairs (method, route, call name, pid, thread...) and of
each resource kept; the SDK's gRPC exporter sends those bytes as they are
(GrpcSpanExporter: its own stub would parse them into a message to serialize it again).
Field numbers are those of opentelemetry/proto/trace/v1/trace.proto and
common/v1/common.proto."""
from __future__ import annotations

import logging
import struct
from collections.abc import Mapping, Sequence

from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter
from opentelemetry.proto.collector.trace.v1.trace_service_pb2 import ExportTraceServiceResponse
from opentelemetry.trace import SpanKind

log = logging.getLogger(__name__)

_SMALL = [bytes([i]) for i in range(128)]
_U64 = (1 << 64) - 1
_FIXED64 = struct.Struct("<Q").pack
_KINDS = {SpanKind.INTERNAL: b"\x30\x01", SpanKind.SERVER: b"\x30\x02", SpanKind.CLIENT: b"\x30\x03",
          SpanKind.PRODUCER: b"\x30\x04", SpanKind.CONSUMER: b"\x30\x05"}
# Span.flags (fixed32, field 16): the parent's is_remote is known, and whether it is set.
_FLAGS_LOCAL, _FLAGS_REMOTE = b"\x85\x01" + struct.pack("<I", 0x100), b"\x85\x01" + struct.pack("<I", 0x300)
_LINK_FLAGS_LOCAL, _LINK_FLAGS_REMOTE = b"\x35" + struct.pack("<I", 0x100), b"\x35" + struct.pack("<I", 0x300)
# Attribute pairs whose bytes are kept: cleared whole when full (values such as
# thread ids repeat for a while, then move on).
PAIR_CACHE_MAX = 4096
RESOURCE_CACHE_MAX = 256


def _varint(n: int) -> bytes:
    if n < 128:
        return _SMALL[n]
    out = bytearray()
    while n > 127:
        out.append((n & 0x7F) | 0x80)
        n >>= 7
    out.append(n)
    return bytes(out)


def _field(tag: bytes, body: bytes) -> bytes:
    """A length-delimited field: tag, length, body."""
    n = len(body)
    return tag + (_SMALL[n] if n < 128 else _varint(n)) + body


def _string(tag: bytes, s) -> bytes:
    """A proto3 string field: nothing when empty or unset, as protobuf writes it."""
    return _field(tag, s.encode()) if s else b""


def _int64(v: int) -> bytes:
    if not -(1 << 63) <= v < (1 << 63):
        raise ValueError(f"{v} is out of int64 range")
    return b"\x18" + _varint(v & _U64)


def any_value(v) -> bytes:
    """An AnyValue's body, in the SDK's order of type checks (a bool is not an int)."""
    t = type(v)
    if t is str:
        return _field(b"\x0a", v.encode())
    if t is int:
        return _int64(v)
    if t is float:
        return b"\x21" + struct.pack("<d", v)
    if v is None:
        return b""
    if isinstance(v, bool):
        return b"\x10\x01" if v else b"\x10\x00"
    if isinstance(v, str):
        return _field(b"\x0a", v.encode())
    if isinstance(v, int):
        return _int64(v)
    if isinstance(v, float):
        return b"\x21" + struct.pack("<d", v)
    if isinstance(v, bytes):
        return _field(b"\x3a", v)
    if isinstance(v, Sequence):
        return _field(b"\x2a", b"".join(_field(b"\x0a", any_value(x)) for x in v))
    if isinstance(v, Mapping):
        return _field(b"\x32", b"".join(_field(b"\x0a", key_value(str(k), x)) for k, x in v.items()))
    raise TypeError(f"invalid type {type(v)} of value {v!r}")


def key_value(key: str, v) -> bytes:
    return _string(b"\x0a", key) + _field(b"\x12", any_value(v))


class SpanEncoder:
    def __init__(self) -> None:
        self._pairs: dict = {}
        self._resources: dict = {}
        self._unencodable: set = set()  # attribute keys warned of (once each)

    def encode(self, spans) -> bytes:
        """The request's bytes: spans grouped by resource, then instrumentation scope
        (one object each here: the SpanBuilder shares them), in first-seen order."""
        groups: dict = {}
        for span in spans:
            key = (id(span.resource), id(span.instrumentation_scope))
            group = groups.get(key)
            if group is None:
                group = groups[key] = (span.resource, span.instrumentation_scope, [])
            group[2].append(_field(b"\x12", self.span(span)))
        by_resource: dict = {}
        for resource, scope, encoded in groups.values():
            scope_spans = _field(b"\x0a", self._scope(scope)) + b"".join(encoded) + \
                _string(b"\x1a", scope.schema_url if scope else None)
            entry = by_resource.setdefault(id(resource), (resource, []))
            entry[1].append(_field(b"\x12", scope_spans))
        return b"".join(
            _field(b"\x0a", _field(b"\x0a", self._resource(r)) + b"".join(s) + _string(b"\x1a", r.schema_url))
            for r, s in by_resource.values())

    def span(self, s) -> bytes:
        ctx = s.context
        parent = s.parent
        out = [b"\x0a\x10", ctx.trace_id.to_bytes(16, "big"), b"\x12\x08", ctx.span_id.to_bytes(8, "big")]
        if ctx.trace_state:
            out.append(_string(b"\x1a", ",".join(f"{k}={v}" for k, v in ctx.trace_state.items())))
        if parent:
            out += (b"\x22\x08", parent.span_id.to_bytes(8, "big"))
        out.append(_string(b"\x2a", s.name))
        out.append(_KINDS[s.kind])
        if s.start_time:
            out.append(b"\x39" + _FIXED64(s.start_time))
        if s.end_time:
            out.append(b"\x41" + _FIXED64(s.end_time))
        self._attributes(b"\x4a", s.attributes, out)
        if s.dropped_attributes:
            out.append(b"\x50" + _varint(s.dropped_attributes))
        for event in s.events:
            body = [b"\x09" + _FIXED64(event.timestamp) if event.timestamp else b"",
                    _string(b"\x12", event.name)]
            self._attributes(b"\x1a", event.attributes, body)
            if event.dropped_attributes:
                body.append(b"\x20" + _varint(event.dropped_attributes))
            out.append(_field(b"\x5a", b"".join(body)))
        if s.dropped_events:
            out.append(b"\x60" + _varint(s.dropped_events))
        for link in s.links:
            body = [b"\x0a\x10", link.context.trace_id.to_bytes(16, "big"),
                    b"\x12\x08", link.context.span_id.to_bytes(8, "big")]
            self._attributes(b"\x22", link.attributes, body)
            if link.dropped_attributes:
                body.append(b"\x28" + _varint(link.dropped_attributes))
            body.append(_LINK_FLAGS_REMOTE if link.context.is_remote else _LINK_FLAGS_LOCAL)
            out.append(_field(b"\x6a", b"".join(body)))
        if s.dropped_links:
            out.append(b"\x70" + _varint(s.dropped_links))
        status = s.status
        if status is not None:
            code = status.status_code.value
            out.append(_field(b"\x7a", _string(b"\x12", status.description) + (b"\x18" + _SMALL[code] if code else b"")))
        out.append(_FLAGS_REMOTE if parent is not None and parent.is_remote else _FLAGS_LOCAL)
        return b"".join(out)

    def _attributes(self, tag: bytes, attributes, out: list) -> None:
        """Each attribute as a KeyValue field; one that cannot be encoded is logged and
        left out, as the SDK does."""
        if not attributes:
            return
        pairs = self._pairs
        for key, value in attributes.items():
            t = type(value)
            if t is str or t is int or t is bool:
                kept = (tag, key, t, value)
            elif (t is list or t is tuple) and all(type(x) is int for x in value):  # a grid, a block
                kept = (tag, key, t, tuple(value))
            else:
                kept = None
            if kept is not None:
                encoded = pairs.get(kept)
                if encoded is not None:
                    out.append(encoded)
                    continue
            try:
                encoded = _field(tag, key_value(key, value))
            except Exception as e:  # an attribute the SDK would not encode either
                if key not in self._unencodable and len(self._unencodable) < 256:
                    self._unencodable.add(key)
                    log.warning("span attribute %s not encoded, left out (said once per name): %s", key, e)
                continue
            if kept is not None:
                if len(pairs) >= PAIR_CACHE_MAX:
                    pairs.clear()
                pairs[kept] = encoded
            out.append(encoded)

    def _resource(self, resource) -> bytes:
        cached = self._resources.get(id(resource))
        if cached is not None and cached[0] is resource:
            return cached[1]
        body: list = []
        self._attributes(b"\x0a", resource.attributes, body)
        encoded = b"".join(body)
        if len(self._resources) >= RESOURCE_CACHE_MAX:
            self._resources.clear()
        self._resources[id(resource)] = (resource, encoded)  # holds it: its id is not reused
        return encoded

    def _scope(self, scope) -> bytes:
        if scope is None:
            return b""
        body = [_string(b"\x0a", scope.name), _string(b"\x12", scope.version)]
        self._attributes(b"\x1a", scope.attributes, body)
        return b"".join(body)


EXPORT_METHOD = "/opentelemetry.proto.collector.trace.v1.TraceService/Export"


class _BytesStub:
    """TraceService's Export taking the request's encoded bytes as they are: the SDK's
    stub would serialize a message (parsed from those bytes first: 1.6-3.6 µs a span)."""

    def __init__(self, channel) -> None:
        self.Export = channel.unary_unary(EXPORT_METHOD, request_serializer=bytes,
                                          response_deserializer=ExportTraceServiceResponse.FromString)


class GrpcSpanExporter(OTLPSpanExporter):
    """The SDK's gRPC span exporter (endpoint, headers, TLS, compression, retries and
    its own metrics unchanged), with the request encoded by SpanEncoder and sent as
    those bytes."""

    def __init__(self, *args, **kwargs) -> None:
        self._encoder = SpanEncoder()
        super().__init__(*args, **kwargs)

    def _initialize_channel_and_stub(self) -> None:
        """At start and at each reconnection (the SDK's): its channel, our stub."""
        super()._initialize_channel_and_stub()
        self._client = _BytesStub(self._channel)

    def _translate_data(self, data) -> bytes:
        return self._encoder.encode(data)
