"""HTTP/2 bytes for the unit tests, built with the real hpack encoder: what a client
and a server put on the wire."""
from __future__ import annotations

import hpack

from otel_gpu.pipeline.protocols.http2.frames import (CONTINUATION, DATA, END_HEADERS, END_STREAM, GOAWAY, HEADERS,
                                                      PREFACE, RST_STREAM, SETTINGS)


def frame(type_: int, flags: int, stream: int, payload: bytes = b"") -> bytes:
    return len(payload).to_bytes(3, "big") + bytes([type_, flags]) + stream.to_bytes(4, "big") + payload


class Peer:
    """One side's encoder: its dynamic table grows as a real peer's does."""

    def __init__(self) -> None:
        self.encoder = hpack.Encoder()

    def headers(self, stream: int, fields: list, end_stream: bool = False, split: int = 0) -> bytes:
        """A HEADERS frame, or HEADERS + CONTINUATION when `split` bytes go in the first."""
        block = self.encoder.encode(fields)
        flags = END_STREAM if end_stream else 0
        if not split or split >= len(block):
            return frame(HEADERS, flags | END_HEADERS, stream, block)
        return frame(HEADERS, flags, stream, block[:split]) + frame(CONTINUATION, END_HEADERS, stream, block[split:])


def settings() -> bytes:
    return frame(SETTINGS, 0, 0, (3).to_bytes(2, "big") + (100).to_bytes(4, "big"))


def data(stream: int, payload: bytes = b"", end_stream: bool = False) -> bytes:
    return frame(DATA, END_STREAM if end_stream else 0, stream, payload)


def rst(stream: int, code: int = 8) -> bytes:
    return frame(RST_STREAM, 0, stream, code.to_bytes(4, "big"))


def goaway(last_stream: int, code: int = 0) -> bytes:
    return frame(GOAWAY, 0, 0, last_stream.to_bytes(4, "big") + code.to_bytes(4, "big"))


def get(path: str = "/infer/1", authority: str = "127.0.0.1:8000", extra: tuple = ()) -> list:
    return [(":method", "GET"), (":scheme", "http"), (":path", path), (":authority", authority), *extra]


def grpc_request(service: str = "demo.Inference", method: str = "Predict") -> list:
    return [(":method", "POST"), (":scheme", "http"), (":path", f"/{service}/{method}"),
            (":authority", "127.0.0.1:50051"), ("content-type", "application/grpc"), ("te", "trailers")]


def grpc_message(payload: bytes = b"\x08\x01") -> bytes:
    return b"\x00" + len(payload).to_bytes(4, "big") + payload


__all__ = ["PREFACE", "Peer", "frame", "settings", "data", "rst", "goaway", "get", "grpc_request", "grpc_message"]
