"""HTTP/2 framing (RFC 9113 section 4) over what the socket probes see of each read or
write: its full length, and either its first HTTP_DATA_CAP bytes or, for a connection
whose frames the kernel walks (bpf/h2_walk.c), a digest: pieces of the transfer that
hold every frame header and the payloads parsing needs (records.H2Digest), across one or
more records.

One FrameSplitter per direction of a connection. A frame split across transfers (or
pieces) is joined; a frame some of whose payload bytes were not copied is handed on cut
(`cut=True`) once its last byte has gone by. Uncopied bytes where a frame header (or
the client preface) was due lose the framing for good (H2FramingError), never guessed;
so does a digest whose walk stopped (H2WalkStopped, with its cause)."""
from __future__ import annotations

from dataclasses import dataclass

PREFACE = b"PRI * HTTP/2.0\r\n\r\nSM\r\n\r\n"
HEADER_LEN = 9
# Frame types (RFC 9113 section 6).
DATA, HEADERS, PRIORITY, RST_STREAM, SETTINGS, PUSH_PROMISE, PING, GOAWAY, WINDOW_UPDATE, CONTINUATION = range(10)
# Flags.
END_STREAM, ACK, END_HEADERS, PADDED, PRIORITY_FLAG = 0x1, 0x1, 0x4, 0x8, 0x20
# A frame longer than this cannot be sent without the peer raising
# SETTINGS_MAX_FRAME_SIZE, which is rarely done; 2^24-1 is the protocol's limit.
DEFAULT_MAX_FRAME = 16384  # SETTINGS_MAX_FRAME_SIZE's initial value (RFC 9113 6.5.2)
MAX_FRAME_LEN = (1 << 24) - 1
# Payload lengths fixed by the frame type, and types that belong to stream 0 (True) or
# to a stream (False) (RFC 9113 section 6): a frame breaking them is not HTTP/2.
_FIXED_LEN = {PRIORITY: 5, RST_STREAM: 4, PING: 8, WINDOW_UPDATE: 4}
_ON_STREAM_0 = {DATA: False, HEADERS: False, PRIORITY: False, RST_STREAM: False, SETTINGS: True,
                PUSH_PROMISE: False, PING: True, GOAWAY: True, CONTINUATION: False}
KEPT_PAYLOAD = 64 * 1024  # payload bytes kept for a frame split across reads


class H2FramingError(ValueError):
    """Bytes that are not HTTP/2 frames, or framing that can no longer be followed.
    `frames`: the whole frames of the same transfer before the fault (FrameSplitter.feed)."""
    frames: list = []


class MalformedFrame(H2FramingError):
    """A frame header no HTTP/2 peer sends: the bytes are not HTTP/2 frames (not a copy or
    walk that fell short)."""


# Why the kernel's walk of a direction stopped (bpf/events.h H2_STOP_*) -> its counter.
WALK_STOPS = {1: ("h2_walk_room", "a transfer's frames needed more digest records than the kernel sends"),
              2: ("h2_walk_steps", "a transfer held more frames than the kernel's walk steps"),
              3: ("h2_walk_iovs", "a transfer's iovec array was longer than the kernel's walk reads"),
              4: ("h2_walk_unreadable", "the kernel could not read the transfer's buffer")}


class H2WalkStopped(H2FramingError):
    """The kernel stopped walking this direction's frames (`counter`: the cause's)."""

    def __init__(self, stop: int) -> None:
        self.counter, why = WALK_STOPS.get(stop, ("h2_walk_unknown", f"the kernel's walk stopped ({stop})"))
        super().__init__(why)


@dataclass
class Frame:
    type: int
    flags: int
    stream: int
    length: int      # the payload length the frame header declares
    payload: bytes   # what was copied of it (all of it unless cut)
    cut: bool = False  # some payload bytes were read but not copied by the probe


class FrameSplitter:
    """Splits one direction's byte stream into frames. `expect_preface`: the client
    direction of a prior-knowledge connection starts with the 24-byte preface."""

    def __init__(self, expect_preface: bool = False, max_frame: int = DEFAULT_MAX_FRAME) -> None:
        self._preface_left = PREFACE if expect_preface else b""
        self._header = b""       # bytes of a frame header not yet whole
        self._frame = None       # (type, flags, stream, length) of the frame whose payload comes
        self._payload = bytearray()
        self._left = 0           # its payload bytes still to come
        self._cut = False
        self._pos = 0            # where the next piece of a digest's transfer starts
        # The client preface's first frame is SETTINGS (RFC 9113 3.4). The server's own
        # SETTINGS is often written before the first read, which the probes do not copy.
        self._first = expect_preface
        self.max_frame = max_frame  # the receiver's SETTINGS_MAX_FRAME_SIZE

    def feed(self, data, length: int) -> list[Frame]:
        """One transfer: `data` copied of its `length` bytes, or a record of its digest
        (records.H2Digest). Returns the frames it completes; raises H2FramingError carrying
        those before the fault."""
        frames: list[Frame] = []
        try:
            if isinstance(data, (bytes, bytearray, memoryview)):
                self._bytes(data, frames)
                self._gap(length - len(data), frames)
            else:
                self._digest(data, length, frames)
        except H2FramingError as e:
            e.frames = frames
            raise
        return frames

    def _digest(self, digest, length: int, frames: list) -> None:
        for at, piece in digest.pieces:
            if at < self._pos:
                raise H2FramingError("digest pieces out of order")
            self._gap(at - self._pos, frames)
            self._bytes(piece, frames)
            self._pos = at + len(piece)
        if digest.stop:
            raise H2WalkStopped(digest.stop)
        if not digest.more:  # the transfer's last record: the rest of it is payload
            self._gap(length - self._pos, frames)
            self._pos = 0

    def _bytes(self, data, frames: list) -> None:
        """Copied bytes of the stream, in order."""
        view, i, n = memoryview(data), 0, len(data)
        if self._preface_left and n:
            k = min(len(self._preface_left), n)
            if bytes(view[:k]) != self._preface_left[:k]:
                raise H2FramingError("no HTTP/2 client preface")
            self._preface_left, i = self._preface_left[k:], k
        while i < n:
            if self._frame is not None:
                take = min(self._left, n - i)
                room = KEPT_PAYLOAD - len(self._payload)
                self._payload += view[i:i + min(take, room)]
                self._cut |= take > room
                self._left -= take
                i += take
                if not self._left:
                    self._end_frame(frames)
                continue
            take = min(HEADER_LEN - len(self._header), n - i)
            self._header += bytes(view[i:i + take])
            i += take
            if len(self._header) == HEADER_LEN:
                self._start_frame(frames)

    def _gap(self, n: int, frames: list) -> None:
        """`n` bytes of the stream that were not copied: they must lie inside a payload."""
        if n <= 0:
            return
        if self._preface_left:
            raise H2FramingError("client preface not copied")
        if self._frame is None:
            raise H2FramingError("frame header past the probe's copy")
        if n > self._left:
            raise H2FramingError("frames past the probe's copy")
        self._left -= n
        self._cut = True
        if not self._left:
            self._end_frame(frames)

    def _start_frame(self, frames: list) -> None:
        h, self._header = self._header, b""
        length, type_, flags = int.from_bytes(h[:3], "big"), h[3], h[4]
        stream = int.from_bytes(h[5:9], "big") & 0x7FFFFFFF
        self._check(length, type_, flags, stream)
        self._frame, self._left, self._cut = (type_, flags, stream, length), length, False
        self._payload = bytearray()
        if not length:
            self._end_frame(frames)

    def _end_frame(self, frames: list) -> None:
        type_, flags, stream, length = self._frame
        frames.append(Frame(type_, flags, stream, length, bytes(self._payload), self._cut))
        self._frame = None

    def _check(self, length: int, type_: int, flags: int, stream: int) -> None:
        if self._first and type_ != SETTINGS:
            raise MalformedFrame(f"first frame is type {type_}, not SETTINGS")
        self._first = False
        if length > self.max_frame:
            raise MalformedFrame(f"frame of {length} bytes, over the {self.max_frame} allowed")
        if _FIXED_LEN.get(type_, length) != length or (type_ == SETTINGS and length % 6) \
                or (type_ == GOAWAY and length < 8):
            raise MalformedFrame(f"frame type {type_} with a payload of {length} bytes")
        on_0 = _ON_STREAM_0.get(type_)
        if on_0 is not None and on_0 != (stream == 0):
            raise MalformedFrame(f"frame type {type_} on stream {stream}")

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet complete (for the close/idle log)."""
        return len(self._header) + len(self._payload)
