"""The protocol seam: what the stitcher asks of a protocol, and what a protocol tells it.

Final API (H5; HTTP/2, gRPC and TLS build on it):

  Protocol (one module-level object per protocol folder, listed in protocols.PROTOCOLS)
    name: str                       "http1", "http2", ... (log and counter text)
    label: str                      what the log says it is not: "HTTP/1.x", "HTTP/2"
    detect(prefix: bytes) -> bool | None
                                    the first bytes of a connection (server side, inbound);
                                    None: need more bytes. Must decide within DETECT_MAX bytes.
    session(config: SessionConfig, handover: Handover | None = None) -> Session
                                    one per connection; handover: the connection switched
                                    to this protocol from another (SwitchProtocol)

  Session (one per connection, server side; all times in ns, tid = the thread of the syscall)
    on_read(data, length, ts_ns, tid) -> list[Event]     one read: copied bytes, full length
    on_write(data, length, tail, ts_ns, tid) -> list[Event]   tail: the write's last bytes
    on_close(ts_ns) -> list[Event]   the peer or server closed: what that completes
    abandon() -> list[Event]         the connection or its requests are being dropped
                                     (error, exit, collector stop): Notices for requests the
                                     session holds that never started (e.g. pipelined ones)
    partial: bool                    a request head is half read: its reading thread may be
                                     about to serve it (no "process" attribution for it)
    written: frozenset               after on_write: the stream ids (!= 0) that write's frames
                                     carry; multiplexed protocols only (pipeline/handlers.py)
    serial: bool                     one request at a time per connection (HTTP/1): whoever
                                     reads a request's head serves the connection until it
                                     is answered (pipeline/contexts.py binds Go units by it)

  Events (returned in order; the stitcher applies them as they come):
    RequestStarted(stream, head, start_ns, tid)   a request opens; stream 0 for HTTP/1,
                                                  the stream id for HTTP/2. tid: the thread
                                                  that read its head ("thread" attribution)
    ResponseStatus(stream, status, streamed)      status known before the end; streamed: the
                                                  body's length is not declared
    RequestFinished(stream, ts_ns, status, error) status None: keep what is known
    StreamReset(stream, ts_ns, reason)            ended without a response (RST_STREAM...):
                                                  finished with error=reason, counted
                                                  requests_incomplete
    ProtocolError(counter, message, drop_reason, level)  bytes that are not this protocol:
                                                  the stitcher logs "pid P fd F: <message>" under
                                                  `counter`, drops the connection's requests
                                                  with error=drop_reason and ignores the
                                                  connection until it closes
    SwitchProtocol(name, handover)                the connection speaks protocol `name` from
                                                  here on (HTTP/1.1 101 to Upgrade: h2c): the
                                                  stitcher replaces the session with that
                                                  protocol's session(config, handover), moves
                                                  the open requests to their new stream ids
                                                  and gives it the rest of this write
    Notice(counter, message=None, level, count)   a counted drop (message None: counted only)

  RequestHead: method, target (origin-form, sanitised), version, headers (lower-case names:
  only those the protocol needs and the configured extra ones), truncated, protocol
  ("http/1.1", "h2", "grpc"), rpc (None or {"system","service","method"}), attributes
  (None or extra span attributes).

Adding a protocol: a folder under protocols/ with a Protocol object, and one line in
protocols/__init__.py PROTOCOLS."""
from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Optional, Union

DETECT_MAX = 64  # bytes: every protocol decides by then (the HTTP/2 preface is 24)


@dataclass
class SessionConfig:
    extra_headers: frozenset = frozenset()  # request headers the user asked to keep (lower-case)


@dataclass
class RequestHead:
    method: str
    target: str  # origin-form (absolute-form cut to its path), sanitised, bounded
    version: str
    headers: dict = field(default_factory=dict)  # lower-cased names: needed + configured only
    truncated: bool = False  # some head bytes were not copied by the probe
    protocol: str = "http/1.1"
    rpc: Optional[dict] = None  # {"system", "service", "method"} for RPC protocols
    attributes: Optional[dict] = None  # extra span attributes the protocol knows
    # How a request's execution unit binds (pipeline/contexts.py), as its protocol says:
    multiplexed: bool = False  # its connection carries other requests at once (HTTP/2 streams)
    binds_at_own_headers: bool = False  # only a write of its response headers and no other stream's frames binds

    @property
    def path(self) -> str:
        return self.target.split("?", 1)[0].split("#", 1)[0] or "/"

    @property
    def query(self) -> Optional[str]:
        return self.target.split("?", 1)[1] if "?" in self.target else None

    @property
    def keep_alive(self) -> bool:
        conn = self.headers.get("connection", "").lower()
        return conn != "close" if self.version == "1.1" else conn == "keep-alive"


@dataclass
class RequestStarted:
    stream: int
    head: RequestHead
    start_ns: int
    tid: int


@dataclass
class ResponseStatus:
    stream: int
    status: int
    streamed: bool = True  # its body's length is not declared (chunked, close-delimited, unknown)


@dataclass
class RequestFinished:
    stream: int
    ts_ns: int
    status: Optional[int] = None
    error: Optional[str] = None


@dataclass
class StreamReset:
    stream: int
    ts_ns: int
    reason: str


@dataclass
class ProtocolError:
    counter: str      # e.g. http_parse_errors
    message: str      # for the log: never header values, targets or bodies
    drop_reason: str  # the error of the requests dropped with the connection
    level: int = logging.WARNING
    hides: bool = True  # a multiplexed connection's requests may go on unseen after it (Proc.hidden)


@dataclass
class Notice:
    counter: str
    message: Optional[str] = None  # None: counted, not logged
    level: int = logging.INFO
    count: int = 1


@dataclass
class Handover:
    """What a session hands to the one that takes its connection over."""
    streams: dict = field(default_factory=dict)  # old stream id -> (new stream id, RequestHead)
    settings: bytes = b""  # the new protocol's opening parameters (h2c: the HTTP2-Settings payload)
    rest: bytes = b""      # the switching write's bytes past the switch point (copied ...
    rest_length: int = 0   # ... of this many), already in the new protocol
    tail: bytes = b""      # that write's last bytes


@dataclass
class SwitchProtocol:
    name: str  # a Protocol.name in protocols.PROTOCOLS
    handover: Handover


Event = Union[RequestStarted, ResponseStatus, RequestFinished, StreamReset, ProtocolError, Notice, SwitchProtocol]


class Session:
    """One connection's protocol state (server side). See the module docstring."""
    partial: bool = False
    written: frozenset = frozenset()
    serial: bool = False
    takes_digest: bool = False  # its on_read/on_write take an HTTP/2 digest (records.H2Digest) for data

    def on_read(self, data: bytes, length: int, ts_ns: int, tid: int) -> list:
        raise NotImplementedError

    def on_write(self, data: bytes, length: int, tail: bytes, ts_ns: int, tid: int) -> list:
        raise NotImplementedError

    def on_close(self, ts_ns: int) -> list:
        return []

    def abandon(self) -> list:
        return []


class Protocol:
    """One protocol: detection and a session factory. See the module docstring."""
    name: str = ""
    label: str = ""

    def detect(self, prefix: bytes) -> Optional[bool]:
        raise NotImplementedError

    def session(self, config: SessionConfig, handover: Optional[Handover] = None) -> Session:
        raise NotImplementedError
