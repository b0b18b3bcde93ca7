"""HTTP/1.x behind the protocol seam: one session per connection turns reads and writes
into request events (stream 0). Pipelined requests wait here, in order, and start when
the response before them completes; a response whose end could not be framed (its head
longer than the probe's copy) completes when the next request arrives or at close.
A 101 Switching Protocols ends HTTP/1 on the connection: to HTTP/2 when the request asked
for h2c and the 101 names it (the request goes on as stream 1: SwitchProtocol); to
anything else (websocket...) the request ends with status 101 and the connection is no
longer followed (counted connections_upgraded)."""
from __future__ import annotations

import base64
import binascii
import logging
from collections import deque

from ..base import (Handover, Notice, ProtocolError, RequestFinished, RequestStarted, ResponseStatus, Session,
                    SessionConfig, SwitchProtocol)
from .framing import HttpParseError, RequestStream, ResponseStream


class Http1Session(Session):
    serial = True  # pipelined requests are answered in order, each after the one before

    def __init__(self, config: SessionConfig) -> None:
        self._requests = RequestStream(config.extra_headers)
        self._responses = ResponseStream()
        self._active = None  # the head of the request being answered
        self._pipelined: deque = deque()  # (head, reading tid) of pipelined requests read ahead
        self._head_start_ns = 0  # first read of the head being assembled
        self._head_tid = 0
        self._last_write_ns = 0

    @property
    def partial(self) -> bool:
        return self._requests.partial > 0

    def on_read(self, data: bytes, length: int, ts_ns: int, tid: int) -> list:
        if not self._requests.partial:
            self._head_start_ns, self._head_tid = ts_ns, tid
        try:
            heads = self._requests.feed(data, length)
        except HttpParseError as e:
            return [ProtocolError("http_parse_errors", f"dropping connection that is not HTTP/1.x ({e})",
                                  "malformed HTTP")]
        out: list = []
        if heads and self._unframed():
            # A new request on the connection means the unframed response was complete.
            out.append(RequestFinished(0, self._last_write_ns))
            self._next(self._last_write_ns, out)
        for head in heads:
            start, head_tid = self._head_start_ns or ts_ns, self._head_tid or tid
            if self._active is None:
                self._start(head, start, head_tid, out)
            else:
                self._pipelined.append((head, head_tid))
            self._head_start_ns, self._head_tid = ts_ns, tid  # next pipelined head
        if not self._requests.partial:
            self._head_start_ns = 0
        return out

    def on_write(self, data: bytes, length: int, tail: bytes, ts_ns: int, tid: int) -> list:
        if self._active is None:
            return [Notice("writes_without_request")]
        self._last_write_ns = ts_ns
        try:
            done = self._responses.feed(data, length, tail, self._active.method)
        except HttpParseError as e:
            return [ProtocolError("http_response_errors", f"response is not HTTP/1.x ({e})",
                                  "malformed HTTP response")]
        out: list = []
        if done is None:
            current = self._responses.current
            if current is not None and current.status is not None:
                out.append(ResponseStatus(0, current.status, current.chunked or current.body_left is None))
            return out
        if done.status == 101:
            return self._switch(done, data, length, tail, ts_ns)
        out.append(RequestFinished(0, ts_ns, done.status))
        self._next(ts_ns, out)
        return out

    def _switch(self, done, data: bytes, length: int, tail: bytes, ts_ns: int) -> list:
        """101 Switching Protocols to the active request: HTTP/1 ends on this connection."""
        head, at = self._active, done.switch_at
        settings = _h2c_settings(head.headers, done.upgrade)
        if settings is None:  # not h2c (websocket...): the exchange ends here, the rest is not followed
            message = ("101 Switching Protocols to a protocol other than h2c "
                       "(or without valid HTTP2-Settings): not followed")
            return [RequestFinished(0, ts_ns, 101),
                    ProtocolError("connections_upgraded", message, "protocol switched", logging.INFO)]
        out = self.abandon()  # requests pipelined behind an upgrade are never answered in HTTP/1
        head.headers.pop("http2-settings", None)
        out.append(SwitchProtocol("http2", Handover({0: (1, head)}, settings, data[at:],
                                                    max(0, length - at), tail)))
        return out

    def on_close(self, ts_ns: int) -> list:
        out: list = []
        if self._requests.partial:
            out.append(Notice("http_incomplete_heads", "connection closed with a request head half read "
                              f"({self._requests.partial} bytes): dropped"))
        if self._unframed():  # close-delimited body (no Content-Length, not chunked): complete now
            out.append(RequestFinished(0, ts_ns))
            self._active = None
        return out

    def abandon(self) -> list:
        n = len(self._pipelined)
        self._pipelined.clear()
        self._active = None
        if not n:
            return []
        return [Notice("pipelined_requests_dropped", f"{n} pipelined request(s) never answered", count=n)]

    def _unframed(self) -> bool:
        """The active response's status is known but its end cannot be framed."""
        r = self._responses.current
        return self._active is not None and r is not None and r.status is not None and r.body_left is None

    def _start(self, head, start_ns: int, tid: int, out: list) -> None:
        self._active = head
        self._responses.start()
        out.append(RequestStarted(0, head, start_ns, tid))

    def _next(self, ts_ns: int, out: list) -> None:
        self._active = None
        if self._pipelined:
            head, tid = self._pipelined.popleft()
            self._start(head, ts_ns, tid, out)


def _h2c_settings(request_headers: dict, response_upgrade: str):
    """The client's SETTINGS payload (RFC 7540 3.2.1) when the request asked for h2c and the
    101 switched to it; None otherwise (or when HTTP2-Settings is not base64url SETTINGS)."""
    asked = {t.strip().lower() for t in request_headers.get("upgrade", "").split(",")}
    if "h2c" not in asked or response_upgrade.strip().lower() != "h2c":
        return None
    raw = request_headers.get("http2-settings")
    if raw is None:
        return None
    try:
        payload = base64.urlsafe_b64decode(raw.strip() + "=" * (-len(raw.strip()) % 4))
    except (binascii.Error, ValueError):
        return None
    return payload if len(payload) % 6 == 0 else None
