"""HTTP/2 framing (RFC 9113 section 4) over what the socket probes see: the first
HTTP_DATA_CAP bytes of each read or write and its full length.

One FrameSplitter per direction of a connection. A frame split across reads is
joined; a frame whose payload was not all copied is handed on cut (`cut=True`) and
the rest of it skipped by its length. When the uncopied bytes of a read go past the
frame they cut, where the next frame starts is unknown: framing is lost for good
(H2FramingError), never guessed."""
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
    `frames`: the whole frames of the same read before the fault (FrameSplitter.feed)."""
    frames: list = []


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
        self._buf = b""          # a frame header (< 9 bytes) or a frame being joined
        self._skip = 0           # uncopied payload bytes of a cut frame still to come
        # The client preface's first frame is SETTINGS (RFC 9113 3.4). The server's own
        # SETTINGS is often written before the first read, which the probes do not copy.
        self._first = expect_preface
        self.max_frame = max_frame  # the receiver's SETTINGS_MAX_FRAME_SIZE

    def feed(self, data: bytes, length: int) -> list[Frame]:
        """One read/write: `data` copied of `length` bytes. Returns the frames it completes;
        raises H2FramingError carrying those before the fault."""
        frames: list[Frame] = []
        try:
            self._feed(data, length, frames)
        except H2FramingError as e:
            e.frames = frames
            raise
        return frames

    def _feed(self, data: bytes, length: int, frames: list) -> None:
        missing = max(0, length - len(data))
        if self._skip:
            # The rest of a cut frame: its copied bytes are payload too, not frames.
            taken = min(self._skip, len(data))
            data, self._skip = data[taken:], self._skip - taken
            if self._skip:
                taken = min(self._skip, missing)
                missing, self._skip = missing - taken, self._skip - taken
        if self._preface_left:
            n = min(len(self._preface_left), len(data))
            if data[:n] != self._preface_left[:n]:
                raise H2FramingError("no HTTP/2 client preface")
            data, self._preface_left = data[n:], self._preface_left[n:]
            if self._preface_left and missing:
                raise H2FramingError("client preface not copied")
        buf = self._buf + data
        pos = 0
        while True:
            if len(buf) - pos < HEADER_LEN:
                break
            length_, type_, flags = int.from_bytes(buf[pos:pos + 3], "big"), buf[pos + 3], buf[pos + 4]
            stream = int.from_bytes(buf[pos + 5:pos + 9], "big") & 0x7FFFFFFF
            self._check(length_, type_, flags, stream)
            end = pos + HEADER_LEN + length_
            if end <= len(buf):
                frames.append(Frame(type_, flags, stream, length_, buf[pos + HEADER_LEN:end]))
                pos = end
                continue
            if not missing:  # the rest comes with the next read
                if length_ > KEPT_PAYLOAD:  # keep only what parsing needs; skip the rest
                    frames.append(Frame(type_, flags, stream, length_, buf[pos + HEADER_LEN:], cut=True))
                    self._skip = end - len(buf)
                    pos = len(buf)
                break
            # The read's uncopied bytes begin inside this frame.
            rest = end - len(buf)
            frames.append(Frame(type_, flags, stream, length_, buf[pos + HEADER_LEN:], cut=True))
            pos = len(buf)
            if rest > missing:
                self._skip = rest - missing
            elif rest < missing:
                raise H2FramingError("frames past the probe's copy")
            missing = 0
            break
        self._buf = buf[pos:]
        if missing:  # uncopied bytes where a frame header (or the preface) was due
            raise H2FramingError("frame header past the probe's copy")

    def _check(self, length: int, type_: int, flags: int, stream: int) -> None:
        if self._first and type_ != SETTINGS:
            raise H2FramingError(f"first frame is type {type_}, not SETTINGS")
        self._first = False
        if length > self.max_frame:
            raise H2FramingError(f"frame of {length} bytes, over the {self.max_frame} allowed")
        if _FIXED_LEN.get(type_, length) != length or (type_ == SETTINGS and length % 6) \
                or (type_ == GOAWAY and length < 8):
            raise H2FramingError(f"frame type {type_} with a payload of {length} bytes")
        on_0 = _ON_STREAM_0.get(type_)
        if on_0 is not None and on_0 != (stream == 0):
            raise H2FramingError(f"frame type {type_} on stream {stream}")

    @property
    def pending(self) -> int:
        """Bytes held of a frame not yet complete (for the close/idle log)."""
        return len(self._buf)
