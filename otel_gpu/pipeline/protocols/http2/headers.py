"""Header blocks of one direction of an HTTP/2 connection: HEADERS (or PUSH_PROMISE)
plus CONTINUATION frames joined, then HPACK-decoded with the direction's own decoder
(its dynamic table lives as long as the connection).

Every block is decoded, whatever its stream, or the table would drift. A block whose
bytes were not all copied by the probe cannot be decoded, and the table is unknown
from then on: HpackLost, the connection is dropped (never a wrong header)."""
from __future__ import annotations

from typing import Optional

import hpack

from .frames import CONTINUATION, END_HEADERS, HEADERS, PADDED, PRIORITY_FLAG, PUSH_PROMISE, Frame, H2FramingError

MAX_BLOCK = 64 * 1024  # header block bytes (compressed) and decoded list size accepted
DEFAULT_TABLE_SIZE = 4096  # SETTINGS_HEADER_TABLE_SIZE's initial value (RFC 9113 6.5.2)


class HpackLost(H2FramingError):
    """The dynamic table of a direction can no longer be followed."""


class HeaderBlocks:
    def __init__(self) -> None:
        self._decoder = hpack.Decoder(max_header_list_size=MAX_BLOCK)
        self._decoder.max_allowed_table_size = DEFAULT_TABLE_SIZE
        self._open: Optional[Frame] = None  # the HEADERS/PUSH_PROMISE frame awaiting CONTINUATION
        self._fragments: list[bytes] = []
        self._size = 0

    def set_table_limit(self, size: int) -> None:
        """The peer's SETTINGS_HEADER_TABLE_SIZE: the largest table this direction's
        encoder may use."""
        self._decoder.max_allowed_table_size = size

    @property
    def in_block(self) -> bool:
        """A block is open: only CONTINUATION of its stream may follow (RFC 9113 6.10)."""
        return self._open is not None

    def feed(self, f: Frame) -> Optional[tuple[Frame, list[tuple[bytes, bytes]]]]:
        """A HEADERS, PUSH_PROMISE or CONTINUATION frame; returns (first frame, headers)
        when a block completes."""
        if f.cut:
            raise HpackLost("header block longer than the probe's copy: HPACK state lost")
        if f.type == CONTINUATION:
            if self._open is None or f.stream != self._open.stream:
                raise H2FramingError("CONTINUATION without an open header block")
            fragment = f.payload
        else:
            if self._open is not None:
                raise H2FramingError("header block interrupted by another frame")
            fragment = _fragment(f)
            self._open, self._fragments, self._size = f, [], 0
        self._fragments.append(fragment)
        self._size += len(fragment)
        if self._size > MAX_BLOCK:
            raise HpackLost(f"header block larger than {MAX_BLOCK // 1024} KiB")
        if not f.flags & END_HEADERS:
            return None
        first, block = self._open, b"".join(self._fragments)
        self._open, self._fragments, self._size = None, [], 0
        try:
            headers = self._decoder.decode(block, raw=True)
        except (hpack.HPACKError, ValueError, IndexError) as e:  # hpack raises its own errors; be safe
            raise HpackLost(f"HPACK error ({type(e).__name__}): HPACK state lost") from None
        return first, [(bytes(n), bytes(v)) for n, v in headers]


def _fragment(f: Frame) -> bytes:
    """The header block fragment of a HEADERS or PUSH_PROMISE frame: padding, priority
    and the promised stream id removed."""
    p, start, end = f.payload, 0, len(f.payload)
    if f.flags & PADDED:
        if not p:
            raise H2FramingError("padded frame without a pad length")
        start, end = 1, len(p) - p[0]
    if f.type == HEADERS and f.flags & PRIORITY_FLAG:
        start += 5
    elif f.type == PUSH_PROMISE:
        start += 4
    if start > end:
        raise H2FramingError("padding or priority longer than the frame")
    return p[start:end]
