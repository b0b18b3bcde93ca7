"""Per-request counts taken out of req_agg before the stream of records reached the end of
their HTTP epoch (kernel_io/reader.py AggregateReader), kept until it does: as the kernel's
bytes, 84 a count and no Python object each, so that a backlog's worth fits in memory."""
from __future__ import annotations

import struct
from array import array
from typing import Callable

from .abi import AggKey, AggValue, layout

KEY, VALUE = layout(AggKey), layout(AggValue)  # req_agg's rows, as BatchMap.packed() reads them
ROW = struct.Struct(KEY.format + VALUE.format[1:])  # a key then its value: a kept count
# A key in u32 words, and the words of its tgid and epoch: the columns a read decides by.
KEY_WORDS, TGID_WORD, EPOCH_WORD = KEY.size // 4, AggKey.tgid.offset // 4, AggKey.epoch.offset // 4
assert ROW.size == KEY.size + VALUE.size and KEY.size % 4 == 0


class KeptCounts:
    """By process: the epochs of its counts (array) and the counts (ROW each), in the order taken."""

    def __init__(self, limit: int) -> None:
        self.limit = limit
        self.n = 0
        self._by: dict[int, tuple[array, bytearray]] = {}

    def __bool__(self) -> bool:
        return self.n > 0

    def room(self) -> int:
        return self.limit - self.n

    def add(self, keys: bytes, values: bytes, at: list[int], tgids: list[int], epochs: list[int]) -> None:
        """Rows `at` of a packed read of req_agg (keys and values back to back), given each
        row's tgid and epoch (the read's columns)."""
        ks, vs, by = KEY.size, VALUE.size, self._by
        for i in at:
            kept = by.get(tgids[i])
            if kept is None:
                kept = by[tgids[i]] = (array("I"), bytearray())
            kept[0].append(epochs[i])
            rows = kept[1]
            rows += keys[i * ks:(i + 1) * ks]
            rows += values[i * vs:(i + 1) * vs]
        self.n += len(at)

    def tgids(self) -> list[int]:
        return list(self._by)

    def take(self, tgid: int, ended: Callable[[int], bool]) -> list[tuple]:
        """The rows of `tgid` whose epoch has `ended` (each the key's fields, then the
        value's), out of the store."""
        kept = self._by.get(tgid)
        if kept is None:
            return []
        epochs, rows = kept
        distinct = set(epochs)  # `ended` asked once an epoch, not once a row
        over = {e for e in distinct if ended(e)}
        if not over:
            return []
        if len(over) == len(distinct):  # all of them: the common case, unpacked in one pass
            del self._by[tgid]
            self.n -= len(epochs)
            return list(ROW.iter_unpack(rows))
        due = [i for i, e in enumerate(epochs) if e in over]
        out = [ROW.unpack_from(rows, i * ROW.size) for i in due]
        gone = set(due)
        left = [i for i in range(len(epochs)) if i not in gone]
        self._by[tgid] = (array("I", (epochs[i] for i in left)),
                          bytearray(b"".join(rows[i * ROW.size:(i + 1) * ROW.size] for i in left)))
        self.n -= len(due)
        return out

    def forget(self, tgid: int) -> None:
        kept = self._by.pop(tgid, None)
        if kept is not None:
            self.n -= len(kept[0])
