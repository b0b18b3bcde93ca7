"""HTTP/1.x: detected by a request method as the first token of a connection."""
from __future__ import annotations

from typing import Optional

from ..base import Handover, Protocol, SessionConfig
from .framing import METHODS
from .session import Http1Session

_LONGEST = max(len(m) for m in METHODS) + 1  # a method and its space


class Http1(Protocol):
    name = "http1"
    label = "HTTP/1.x"

    def detect(self, prefix: bytes) -> Optional[bool]:
        token, space, _ = prefix.partition(b" ")
        if space:
            return token in METHODS
        if len(prefix) >= _LONGEST or not any(m.startswith(prefix) for m in METHODS):
            return False
        return None

    def session(self, config: SessionConfig, handover: Optional[Handover] = None) -> Http1Session:
        return Http1Session(config)  # nothing switches to HTTP/1


PROTOCOL = Http1()
