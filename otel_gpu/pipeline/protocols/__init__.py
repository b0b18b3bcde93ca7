"""The protocol registry: which protocol a connection speaks, from its first bytes.

Each protocol is one folder (see base.py for the interface) and one line in PROTOCOLS.
Order matters: a prefix goes to the first protocol that claims it, and only once every
protocol before it has refused it."""
from __future__ import annotations

from .base import DETECT_MAX, Protocol
from .http1 import PROTOCOL as HTTP1
from .http2 import PROTOCOL as HTTP2


class _Pending:
    def __repr__(self) -> str:
        return "PENDING"


PENDING = _Pending()  # more bytes are needed to tell

PROTOCOLS: list = [
    HTTP1,
    HTTP2,  # h2c prior knowledge, and gRPC over it
]


def detect(prefix: bytes):
    """The Protocol that `prefix` (a connection's first inbound bytes) starts, PENDING while
    one may claim it with more bytes, None when none does (or none has by DETECT_MAX)."""
    for proto in PROTOCOLS:
        verdict = proto.detect(prefix)
        if verdict:
            return proto
        if verdict is None:
            return PENDING if len(prefix) < DETECT_MAX else None
    return None


def by_name(name: str) -> Protocol:
    """The protocol a SwitchProtocol names."""
    return next(p for p in PROTOCOLS if p.name == name)


def labels() -> str:
    """What the log says an unclaimed connection is not: "HTTP/1.x nor HTTP/2"."""
    return " nor ".join(p.label for p in PROTOCOLS)


__all__ = ["DETECT_MAX", "PENDING", "PROTOCOLS", "Protocol", "by_name", "detect", "labels"]
