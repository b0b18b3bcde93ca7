"""HTTP/1.x framing from what the socket probes see: the first HTTP_DATA_CAP bytes
of each read/write and its full length. Requests and responses are framed by
byte counts (Content-Length, chunked terminator, close), so bodies larger than
what was copied are still skipped exactly."""
from __future__ import annotations

import re
from dataclasses import dataclass
from typing import Optional

from .... import sanitize
from ..base import RequestHead

METHODS = frozenset({b"GET", b"POST", b"PUT", b"HEAD", b"DELETE", b"PATCH", b"OPTIONS",
                     b"TRACE", b"CONNECT"})
_REQUEST_LINE = re.compile(rb"^([A-Z]{3,7}) (\S{1,8192}) HTTP/(1\.[01])$")
_STATUS_LINE = re.compile(rb"^HTTP/(1\.[01]) (\d{3})(?: .*)?$")
# Headers the collector reads; others are never kept (privacy by default).
_KEPT_HEADERS = frozenset({"content-length", "transfer-encoding", "connection",
                           "traceparent", "tracestate",
                           "upgrade", "http2-settings"})  # a switch to h2c (session.py)
MAX_HEAD = 64 * 1024  # a request head beyond this is dropped as malformed
# Absolute-form target (RFC 9112 3.2.2): scheme and authority, userinfo included.
_ABSOLUTE_PREFIX = re.compile(r"^[A-Za-z][A-Za-z0-9+.-]*://[^/?#]*")


class HttpParseError(ValueError):
    """Bytes that are not HTTP/1.x: the connection is dropped and counted."""


def _parse_headers(lines: list[bytes], extra: frozenset) -> dict:
    headers = {}
    for line in lines:
        name, sep, value = line.partition(b":")
        if not sep or not name or name != name.strip():
            raise HttpParseError(f"bad header line ({len(line)} bytes)")  # values may be secrets
        key = name.decode("latin-1").lower()
        if key in _KEPT_HEADERS or key in extra:
            headers[key] = sanitize.from_bytes(value.strip(), sanitize.MAX_NETWORK_CHARS)
    return headers


def safe_target(raw: bytes) -> str:
    """The request target as exported: an absolute-form target (`http://user:pw@host/a`)
    loses scheme and authority, so userinfo never goes further; then sanitised and cut
    to MAX_NETWORK_CHARS (path and query are split from this)."""
    target = raw.decode("utf-8", "replace")
    m = _ABSOLUTE_PREFIX.match(target)
    if m:
        target = target[m.end():]
        target = target if target.startswith("/") else "/" + target
    return sanitize.text(target, sanitize.MAX_NETWORK_CHARS)


def describe_request_line(line: bytes) -> str:
    """What the log may say of a request line that is refused: its method (when it is
    one) and length, never the target or its query."""
    token = line.split(b" ", 1)[0]
    if token in METHODS:
        return f"{token.decode()}, {len(line)} bytes"
    return f"no method, {len(line)} bytes, first byte 0x{line[:1].hex() or '--'}"


def _body_length(headers: dict) -> Optional[int]:
    """Declared body length; None for chunked (framed by its terminator)."""
    if "chunked" in headers.get("transfer-encoding", "").lower():
        return None
    raw = headers.get("content-length", "0")
    if not (raw.isascii() and raw.isdigit()):  # "²".isdigit() is True
        raise HttpParseError(f"bad content-length {raw[:20]!r}")
    return int(raw)


class RequestStream:
    """Splits the inbound byte stream of one connection into request heads.

    feed() takes one read (copied bytes, full length) and returns the heads that
    completed in it. Bodies are skipped by Content-Length. When framing is lost
    (a head whose end was not copied, a chunked body), the stream resynchronises
    on the next read that starts with a method: how the BPF side decides too."""

    def __init__(self, extra_headers: frozenset = frozenset()) -> None:
        self.extra_headers = extra_headers
        self._head = b""
        self._body_left = 0
        self._resync = False

    @property
    def partial(self) -> int:
        """Bytes of a request head read so far whose end has not come yet."""
        return len(self._head)

    def feed(self, data: bytes, length: int) -> list[RequestHead]:
        heads: list[RequestHead] = []
        missing = max(0, length - len(data))  # bytes read but not copied
        if self._resync:
            if not _starts_with_method(data):
                return heads
            self._resync, self._head, self._body_left = False, b"", 0
        pos = 0
        while True:
            if self._body_left:
                copied = min(self._body_left, len(data) - pos)
                pos += copied
                self._body_left -= copied
                uncopied = min(self._body_left, missing)
                missing -= uncopied
                self._body_left -= uncopied
            if pos >= len(data):
                if missing and not self._body_left:
                    if self._head:
                        heads.append(self._finish_head(self._head, truncated=True))
                    elif length:
                        raise HttpParseError("request bytes beyond the probe's copy")
                    self._resync = True
                return heads
            chunk = self._head + data[pos:]
            end = chunk.find(b"\r\n\r\n")
            if end < 0:
                if len(chunk) + missing > MAX_HEAD:
                    raise HttpParseError("request head larger than 64 KiB")
                _check_start(chunk)
                self._head, pos = chunk, len(data)
                continue
            consumed = end + 4 - len(self._head)
            self._head = b""
            head = self._finish_head(chunk[:end], truncated=False)
            heads.append(head)
            pos += consumed
            body = _body_length(head.headers)
            if body is None:  # chunked request body: framing by terminator is not tracked
                self._resync = True
                return heads
            self._body_left = body

    def _finish_head(self, head_bytes: bytes, truncated: bool) -> RequestHead:
        lines = head_bytes.split(b"\r\n")
        m = _REQUEST_LINE.match(lines[0])
        if not m or m.group(1) not in METHODS:
            raise HttpParseError(f"bad request line ({describe_request_line(lines[0])})")
        if truncated and len(lines) == 1:
            raise HttpParseError("request line longer than the probe's copy")
        # A cut-short head's last line may be partial: not trusted.
        complete_lines = lines[1:-1] if truncated else lines[1:]
        headers = _parse_headers(complete_lines, self.extra_headers)
        return RequestHead(m.group(1).decode(), safe_target(m.group(2)), m.group(3).decode(),
                           headers, truncated)


def _starts_with_method(data: bytes) -> bool:
    return data.split(b" ", 1)[0] in METHODS


def _check_start(chunk: bytes) -> None:
    """Rejects a head-to-be as soon as its first token cannot be a method."""
    token = chunk.split(b" ", 1)[0]
    if (b" " in chunk[:9] or len(chunk) >= 8) and token not in METHODS:
        raise HttpParseError(f"not an HTTP/1.x request ({describe_request_line(chunk)})")


@dataclass
class ResponseState:
    status: Optional[int] = None
    version: Optional[str] = None
    body_left: Optional[int] = None  # None: until chunked terminator or close
    chunked: bool = False
    complete: bool = False
    upgrade: str = ""   # a 101's Upgrade header: the protocol switched to
    switch_at: int = 0  # a 101: where in the write's copied bytes that protocol starts


class ResponseStream:
    """Tracks the outbound byte stream of one connection: when the current response
    has been written completely (Content-Length bytes, chunked terminator, or the
    connection closing)."""

    def __init__(self) -> None:
        self.current: Optional[ResponseState] = None
        self._head = b""

    def start(self) -> None:
        self.current = ResponseState()
        self._head = b""

    def feed(self, data: bytes, length: int, tail: bytes, request_method: str) -> Optional[ResponseState]:
        """Feed one write; returns the response state once it is complete."""
        r = self.current
        if r is None:
            return None  # bytes with no request waiting (e.g. after an error): ignored
        if r.status is None:
            chunk = self._head + data
            end = chunk.find(b"\r\n\r\n")
            if end < 0:
                if not chunk.startswith(b"HTTP/"[: len(chunk)]):
                    raise HttpParseError(f"not an HTTP/1.x response ({len(chunk)} bytes, "
                                         f"first byte 0x{chunk[:1].hex()})")
                if length > len(data) or len(chunk) > MAX_HEAD:
                    # The head's end was not copied: keep the status, stop framing this
                    # response; it ends when the next request arrives or the connection closes.
                    m = _STATUS_LINE.match(chunk.split(b"\r\n", 1)[0])
                    if not m or b"\r\n" not in chunk:
                        raise HttpParseError("response status line longer than the probe's copy")
                    if m.group(2) == b"101":  # where the new protocol starts is unknown
                        raise HttpParseError("101 response head longer than the probe's copy")
                    r.status, r.version, r.body_left = int(m.group(2)), m.group(1).decode(), None
                    self._head = b""
                    return None
                self._head = chunk
                return None
            lines = chunk[:end].split(b"\r\n")
            m = _STATUS_LINE.match(lines[0])
            if not m:
                raise HttpParseError(f"bad status line ({len(lines[0])} bytes)")
            status = int(m.group(2))
            headers = _parse_headers(lines[1:], frozenset())
            head_len = end + 4 - len(self._head)
            self._head = b""
            if status == 101:  # Switching Protocols: the bytes after it are another protocol's
                r.status, r.version, r.body_left, r.complete = status, m.group(1).decode(), 0, True
                r.upgrade, r.switch_at = headers.get("upgrade", ""), head_len
                self.current = None
                return r
            if 100 <= status < 200:  # interim response: the real one follows
                final = self.feed(data[head_len:], length - head_len, tail, request_method) \
                    if length > head_len else None
                if final is not None and final.status == 101:
                    final.switch_at += head_len
                return final
            r.status, r.version = status, m.group(1).decode()
            if request_method == "HEAD" or status in (204, 304):
                r.body_left = 0
            else:
                declared = _body_length(headers) if ("content-length" in headers or
                                                     "transfer-encoding" in headers) else None
                r.chunked = "chunked" in headers.get("transfer-encoding", "").lower()
                r.body_left = declared
            length -= head_len
        if r.chunked:
            if length > 0 and tail.endswith(b"0\r\n\r\n"):
                r.body_left = 0
        elif r.body_left is not None:
            r.body_left = max(0, r.body_left - max(0, length))
        if r.body_left == 0:
            r.complete = True
            self.current = None
            return r
        return None
