"""What the kernel's frame walk (bpf/h2_walk.c) hands user space for a byte stream cut
into transfers: a model of its rules, for the unit tests of the digest's consumer. The
real walk runs in the bpf tier (tests/bpf/test_h2_streams.py)."""
from __future__ import annotations

from otel_gpu.kernel_io.abi import H2_DIGEST_CAP, H2_DIGEST_HEAD, H2_DIGEST_RECORDS, H2_PIECE_HEAD, H2_STOP_ROOM
from otel_gpu.records import H2Digest

KEPT = {1: None, 3: None, 4: None, 5: None, 9: None, 7: 8}  # frame type -> payload bytes kept (None: all)
ROOM = H2_DIGEST_CAP - H2_DIGEST_HEAD


class _Full(Exception):
    pass


class Walk:
    """One direction's walk: its position in the frames, across transfers."""

    def __init__(self, preface: bool = True) -> None:
        self.skip = self.keep = 24 if preface else 0
        self.header, self.stop = b"", 0

    def transfer(self, raw: bytes) -> list[H2Digest]:
        """The transfer's digest records (past H2_DIGEST_RECORDS, the walk stops for good:
        H2_STOP_ROOM on this transfer's last record and every later one)."""
        if self.stop:
            return [H2Digest((), stop=self.stop)]
        self.records, self.pieces, self.room = [], [], ROOM
        try:
            self._walk(raw)
        except _Full:
            self.stop = H2_STOP_ROOM
        return self.records + [H2Digest(tuple(self.pieces), stop=self.stop)]

    def _walk(self, raw: bytes) -> None:
        pos = 0
        while pos < len(raw):
            if self.skip:
                n = min(self.skip, len(raw) - pos)
                k = min(self.keep, n)
                if k:
                    self._copy(pos, raw[pos:pos + k])
                    self.keep -= k
                self.skip -= n
                pos += n
                continue
            n = min(9 - len(self.header), len(raw) - pos)
            self._copy(pos, raw[pos:pos + n])
            self.header += raw[pos:pos + n]
            pos += n
            if len(self.header) == 9:
                self.skip = int.from_bytes(self.header[:3], "big")
                kept = KEPT.get(self.header[3], 0)
                self.keep = self.skip if kept is None else min(kept, self.skip)
                self.header = b""

    def _copy(self, at: int, b: bytes) -> None:
        while b:
            last = self.pieces[-1] if self.pieces else None
            contiguous = last is not None and last[0] + len(last[1]) == at
            n = min(len(b), self.room - (0 if contiguous else H2_PIECE_HEAD))
            if n <= 0:  # this record is full
                if len(self.records) + 1 >= H2_DIGEST_RECORDS:
                    raise _Full
                self.records.append(H2Digest(tuple(self.pieces), more=True))
                self.pieces, self.room = [], ROOM
                continue
            if contiguous:
                self.pieces[-1] = (last[0], last[1] + b[:n])
            else:
                self.pieces.append((at, b[:n]))
                self.room -= H2_PIECE_HEAD
            self.room -= n
            at, b = at + n, b[n:]


def walk(transfers: list[bytes], preface: bool = True) -> list[list[H2Digest]]:
    """Each transfer's digest records, as the kernel would send them."""
    w = Walk(preface)
    return [w.transfer(raw) for raw in transfers]
