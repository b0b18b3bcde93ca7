"""One HTTP/2 server connection (h2c: prior knowledge, or switched from HTTP/1.1 by
`Upgrade: h2c`, RFC 7540 3.2): frames each way
(frames.py), header blocks through one HPACK decoder per direction (headers.py),
and the streams' lives turned into the seam's events (protocols/base.py):
  client HEADERS opening a stream          -> RequestStarted (method, :path, :authority)
  server HEADERS with :status              -> ResponseStatus
  END_STREAM from the server               -> RequestFinished (status, gRPC status)
  RST_STREAM either way, GOAWAY past its last stream -> StreamReset
SETTINGS (but its header table size), PING, WINDOW_UPDATE, PRIORITY and DATA
payloads are not needed: skipped by their length. The kernel walks the frames of each
transfer (bpf/h2_walk.c) and hands over a digest of what parsing needs, however many
frames one read carries; a connection it could not walk is copied as any other (1 KiB
of each transfer). Bytes that are not HTTP/2, or framing/HPACK state lost to a copy,
raise H2FramingError: the stitcher drops the connection and counts it (ProtocolError:
`h2_parse_errors`; `h2_hpack_lost` when a header block was not all copied; `h2_walk_*`
where the kernel's walk stopped, by cause).
Upgrade: h2c hands over the upgraded request as stream 1, already open (its head is
the HTTP/1.1 one; its response comes as HTTP/2), and the client's HTTP2-Settings.
gRPC: the RPC's status code (grpc-status in the trailers) goes into head.rpc
["status_code"] before the stream's RequestFinished (the request holds that head)."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .... import sanitize
from ..base import (Handover, Notice, ProtocolError, RequestFinished, RequestHead, RequestStarted, ResponseStatus,
                    Session, SessionConfig, StreamReset)
from ..http1.framing import safe_target
from . import grpc
from .frames import (ACK, DEFAULT_MAX_FRAME, MAX_FRAME_LEN, DATA, END_STREAM, GOAWAY, HEADERS, PUSH_PROMISE,
                     CONTINUATION, RST_STREAM, SETTINGS, FrameSplitter, H2FramingError, MalformedFrame)
from .headers import MAX_BLOCK, HeaderBlocks, HpackLost

SETTINGS_HEADER_TABLE_SIZE, SETTINGS_MAX_FRAME_SIZE = 0x1, 0x5
# Request headers kept besides the configured ones (privacy by default).
_KEPT = frozenset({"content-type", "traceparent", "tracestate"})
MAX_OPEN_STREAMS = 1024  # more concurrent streams than any server allows by default: not followed


@dataclass
class _Stream:
    status: Optional[int] = None
    head: Optional[RequestHead] = None
    headers_done: bool = False  # response headers seen: a later HEADERS block is trailers


@dataclass
class _Direction:
    frames: FrameSplitter
    blocks: HeaderBlocks = field(default_factory=HeaderBlocks)
    block_ts: int = 0   # when the open header block's first frame was seen
    block_tid: int = 0


class H2Session(Session):
    takes_digest = True

    def __init__(self, config: SessionConfig = SessionConfig(), preface: bool = True,
                 handover: Optional[Handover] = None) -> None:
        self.extra_headers = config.extra_headers
        # The server's SETTINGS (its limits on what the client sends) is usually written
        # before the first read, when the probes copy nothing yet: the protocol's widest
        # limits stand for the client's frames until one is seen.
        self._in = _Direction(FrameSplitter(expect_preface=preface, max_frame=MAX_FRAME_LEN))
        self._in.blocks.set_table_limit(MAX_BLOCK)
        self._out = _Direction(FrameSplitter())
        self._streams: dict[int, _Stream] = {}
        self._last_client_stream = 0
        self._failed = False
        self._server_framed = False  # a whole frame seen from the server: it speaks HTTP/2 here
        if handover is not None:
            self._take_over(handover)

    def _take_over(self, handover: Handover) -> None:
        """After 101 to Upgrade: h2c: the upgraded request is stream 1, half closed by the
        client (RFC 7540 3.2); the client's HTTP2-Settings bind what the server sends
        until its preface's SETTINGS (the server may answer stream 1 before reading it)."""
        self._settings(handover.settings, self._out)
        for stream, head in handover.streams.values():
            head.version, head.protocol = "2", "h2"  # its response is HTTP/2
            head.multiplexed = head.binds_at_own_headers = True
            self._streams[stream] = _Stream(head=head)
            self._last_client_stream = max(self._last_client_stream, stream)

    # --- seam interface --------------------------------------------------------
    def on_read(self, data: bytes, length: int, ts_ns: int, tid: int) -> list:
        return self._guard(self._in, data, length, ts_ns, tid, self._client_frame)

    def on_write(self, data: bytes, length: int, tail: bytes, ts_ns: int, tid: int) -> list:
        self.written = frozenset()
        return self._guard(self._out, data, length, ts_ns, tid, self._server_frame)

    def on_close(self, ts_ns: int) -> list:
        return []  # the stitcher ends the streams still open with the connection

    # --- framing ---------------------------------------------------------------
    def _guard(self, d: _Direction, data: bytes, length: int, ts_ns: int, tid: int, handle) -> list:
        """The events of one read/write; at bytes that cannot be followed, those before
        them and a ProtocolError (the stitcher ends the open streams with an error)."""
        events: list = []
        if self._failed:
            return events
        try:
            self._on_frames(d, data, length, ts_ns, tid, handle, events)
        except H2FramingError as e:  # HpackLost and H2WalkStopped included
            self._failed = True
            counter = "h2_hpack_lost" if isinstance(e, HpackLost) else getattr(e, "counter", "h2_parse_errors")
            # The server's first bytes are no frame (an HTTP/1 server answering the preface):
            # it never spoke HTTP/2 here, so no request goes on unseen on the connection.
            never = isinstance(e, MalformedFrame) and d is self._out and not self._server_framed
            events.append(ProtocolError(counter, f"dropping HTTP/2 connection ({e})"
                                        + ("; the server never answered in HTTP/2" if never else ""),
                                        "malformed HTTP/2", hides=not never))
        return events

    def _on_frames(self, d: _Direction, data: bytes, length: int, ts_ns: int, tid: int, handle,
                   events: list) -> None:
        try:
            frames, fault = d.frames.feed(data, length), None
        except H2FramingError as e:  # the frames before it still count
            frames, fault = e.frames, e
        if d is self._out:  # which streams this write carries: a handler thread's binding
            self.written = frozenset(f.stream for f in frames if f.stream)
            self._server_framed = self._server_framed or bool(frames)
        for f in frames:
            if f.type in (HEADERS, PUSH_PROMISE, CONTINUATION):
                if not d.blocks.in_block:
                    d.block_ts, d.block_tid = ts_ns, tid
                done = d.blocks.feed(f)
                if done is not None:
                    first, headers = done
                    handle(first, headers, d.block_ts, d.block_tid, events)
                continue
            if d.blocks.in_block:
                raise H2FramingError("header block interrupted by another frame")
            if f.type == SETTINGS and not f.flags & ACK:
                other = self._out if d is self._in else self._in
                self._settings(f.payload, other)
            elif f.type in (DATA, RST_STREAM, GOAWAY):
                handle(f, None, ts_ns, tid, events)
            # PRIORITY, PING, WINDOW_UPDATE, unknown types (RFC 9113 5.5): ignored
        if fault is not None:
            raise fault

    @staticmethod
    def _settings(payload: bytes, other: _Direction) -> None:
        """The sender's limits on what the other direction may send: its header table
        size and largest frame."""
        for i in range(0, len(payload) - 5, 6):
            key, value = int.from_bytes(payload[i:i + 2], "big"), int.from_bytes(payload[i + 2:i + 6], "big")
            if key == SETTINGS_HEADER_TABLE_SIZE:
                other.blocks.set_table_limit(value)
            elif key == SETTINGS_MAX_FRAME_SIZE and DEFAULT_MAX_FRAME <= value <= MAX_FRAME_LEN:
                other.frames.max_frame = value

    # --- client to server ------------------------------------------------------
    def _client_frame(self, f, headers, ts_ns: int, tid: int, events: list) -> None:
        if f.type == HEADERS:
            if f.stream == 0:
                raise H2FramingError("HEADERS on stream 0")
            if f.stream in self._streams or f.stream <= self._last_client_stream:
                return  # request trailers, or a stream already finished
            if f.stream % 2 == 0:
                raise H2FramingError(f"client opened even stream {f.stream}")
            self._last_client_stream = f.stream
            if len(self._streams) >= MAX_OPEN_STREAMS:
                events.append(Notice("h2_streams_untracked",
                                     f"stream {f.stream}: {MAX_OPEN_STREAMS} streams already open, not followed"))
                return
            head = self._request_head(headers)
            self._streams[f.stream] = _Stream(head=head)
            events.append(RequestStarted(f.stream, head, ts_ns, tid))
        elif f.type == RST_STREAM and self._streams.pop(f.stream, None) is not None:
            events.append(StreamReset(f.stream, ts_ns, "reset by the client"))
        elif f.type == GOAWAY:
            self._goaway(f, ts_ns, "client", events)

    def _request_head(self, headers: list) -> RequestHead:
        pseudo: dict[bytes, bytes] = {}
        kept: dict[str, str] = {}
        for name, value in headers:
            if name.startswith(b":"):
                pseudo.setdefault(name, value)
                continue
            key = name.decode("latin-1").lower()
            if key in _KEPT or key in self.extra_headers:
                kept[key] = sanitize.from_bytes(value, sanitize.MAX_NETWORK_CHARS)
        method = sanitize.text(pseudo.get(b":method", b"").decode("latin-1"), 16)
        if not method:
            raise H2FramingError("request without :method")
        if b":authority" in pseudo:
            kept["host"] = sanitize.from_bytes(pseudo[b":authority"], sanitize.MAX_NETWORK_CHARS)
        target = safe_target(pseudo.get(b":path", b"/"))
        if grpc.is_grpc(kept.get("content-type")):
            # gRPC C-core writes whatever frames are queued, from whichever thread holds
            # its combiner: no write says whose unit made it (pipeline/handlers.py)
            head = RequestHead(method, target, "2", kept, protocol="grpc", multiplexed=True)
            head.rpc = grpc.rpc_of(head.path)
            head.rpc["status_code"] = None  # set from the trailers
            return head
        return RequestHead(method, target, "2", kept, protocol="h2", multiplexed=True, binds_at_own_headers=True)

    # --- server to client ------------------------------------------------------
    def _server_frame(self, f, headers, ts_ns: int, tid: int, events: list) -> None:
        s = self._streams.get(f.stream)
        if f.type == HEADERS and s is not None:
            self._response_headers(f.stream, s, headers, events)
        elif f.type == RST_STREAM and s is not None:
            del self._streams[f.stream]
            events.append(StreamReset(f.stream, ts_ns, "reset by the server"))
            return
        elif f.type == GOAWAY:
            self._goaway(f, ts_ns, "server", events)
            return
        if s is not None and f.type in (HEADERS, DATA) and f.flags & END_STREAM:
            del self._streams[f.stream]
            rpc = s.head.rpc
            error = "gRPC response without grpc-status" if rpc and rpc["status_code"] is None else None
            events.append(RequestFinished(f.stream, ts_ns, s.status, error))

    @staticmethod
    def _response_headers(stream: int, s: _Stream, headers: list, events: list) -> None:
        fields = dict(reversed(headers))  # the first of a repeated name wins
        if not s.headers_done:
            raw = fields.get(b":status", b"")
            if not (len(raw) == 3 and raw.isdigit()):
                raise H2FramingError("response without a valid :status")
            status = int(raw)
            if 100 <= status < 200:
                return  # interim response: the final one follows
            s.status, s.headers_done = status, True
            events.append(ResponseStatus(stream, status))
        if s.head.rpc is not None and b"grpc-status" in fields:  # trailers, or trailers-only
            s.head.rpc["status_code"] = grpc.status_code(fields[b"grpc-status"])

    def _goaway(self, f, ts_ns: int, sender: str, events: list) -> None:
        """Streams past GOAWAY's last stream id were not and will not be processed."""
        if len(f.payload) < 8:
            raise H2FramingError("GOAWAY shorter than 8 bytes")
        last = int.from_bytes(f.payload[:4], "big") & 0x7FFFFFFF
        for stream in [s for s in self._streams if s > last]:
            del self._streams[stream]
            events.append(StreamReset(stream, ts_ns, f"GOAWAY from the {sender}"))
