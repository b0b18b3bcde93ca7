"""Per-request counts taken out of req_agg before the stream of records reached the end of
their HTTP epoch (kernel_io/reader.py AggregateReader), kept until it does: packed, 84
bytes a count and no Python object each, so that a backlog's worth fits in memory."""
from __future__ import annotations

import struct
from array import array
from typing import Callable

ROW = struct.Struct("=IIIIQQQQQQQQ")  # abi.AggKey's fields, then abi.AggValue's


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

    def add(self, key: tuple, value: tuple) -> None:
        """One req_agg row (its key's and value's fields, as BatchMap.rows() gives them)."""
        kept = self._by.get(key[0])
        if kept is None:
            kept = self._by[key[0]] = (array("I"), bytearray())
        kept[0].append(key[2])
        kept[1].extend(ROW.pack(*key, *value))
        self.n += 1

    def tgids(self) -> list[int]:
        return list(self._by)

    def take(self, tgid: int, ended: Callable[[int], bool]) -> list[tuple[tuple, tuple]]:
        """The (key, value) rows of `tgid` whose epoch has `ended`, out of the store."""
        kept = self._by.get(tgid)
        if kept is None:
            return []
        epochs, rows = kept
        due = [i for i, e in enumerate(epochs) if ended(e)]
        if not due:
            return []
        out = []
        for i in due:
            fields = ROW.unpack_from(rows, i * ROW.size)
            out.append((fields[:6], fields[6:]))
        if len(due) == len(epochs):
            del self._by[tgid]
        else:
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
