"""HTTP/2 cleartext (prior knowledge, or HTTP/1.1 `Upgrade: h2c`) and gRPC over it, behind the protocol seam."""
from __future__ import annotations

from typing import Optional

from ..base import Handover, Protocol, SessionConfig
from .frames import PREFACE
from .session import H2Session


class Http2(Protocol):
    name = "http2"
    label = "HTTP/2"

    def detect(self, prefix: bytes) -> Optional[bool]:
        """The client preface (prior knowledge: h2c without an HTTP/1.1 upgrade)."""
        n = min(len(prefix), len(PREFACE))
        if prefix[:n] != PREFACE[:n]:
            return False
        return True if n == len(PREFACE) else None

    def session(self, config: SessionConfig, handover: Optional[Handover] = None) -> H2Session:
        return H2Session(config, handover=handover)


PROTOCOL = Http2()
