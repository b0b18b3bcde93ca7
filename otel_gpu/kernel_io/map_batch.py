"""A BPF hash map read and cleared with the kernel's batch commands (BPF_MAP_LOOKUP_BATCH,
BPF_MAP_DELETE_BATCH, Linux >= 5.6): a few syscalls for the whole map instead of three
per entry (get-next-key, lookup, delete) through bcc's iterator. Buffers are allocated
once. bcc's own items_lookup_batch allocates max_entries keys and values per call and
shares one c_uint32 between its batch token and its count, so it is not used."""
from __future__ import annotations

import ctypes as ct
import errno
import logging
from typing import Optional

from bcc.libbcc import lib

log = logging.getLogger(__name__)


class BatchMap:
    """items(), packed() and delete(keys) of one bcc hash table; falls back to bcc's per-entry
    calls where the kernel refuses the batch commands (logged once)."""

    def __init__(self, table, name: str) -> None:
        """`name`: the map's, for log lines (bcc's hash tables do not keep it)."""
        self.table = table
        self.name = name
        self.Key, self.Leaf = table.Key, table.Leaf
        self._n = table.max_entries
        self._keys = (table.Key * self._n)()
        self._values = (table.Leaf * self._n)()
        self._batched = True

    def packed(self) -> tuple[bytes, bytes]:
        """Every entry as the kernel lays it out: (keys, values), the keys back to back
        and their values likewise. For a map read at every poll whose entries mostly stay
        (req_agg): its reader looks at a few fields of each through a memoryview, and keeps
        or deletes rows by their bytes, with no Python object per entry."""
        total = self._read()
        if total is None:
            entries = self.table.items()
            return b"".join(bytes(k) for k, _ in entries), b"".join(bytes(v) for _, v in entries)
        return (ct.string_at(self._keys, total * ct.sizeof(self.Key)),
                ct.string_at(self._values, total * ct.sizeof(self.Leaf)))

    def items(self) -> list:
        """(key, value) of every entry, copies (the buffers are reused)."""
        total = self._read()
        if total is None:
            return list(self.table.items())
        # One copy of what was read: its elements are views into it, and the buffers are
        # overwritten by the next read.
        keys = (self.Key * total).from_buffer_copy(self._keys)
        values = (self.Leaf * total).from_buffer_copy(self._values)
        return list(zip(keys, values))

    def _read(self) -> Optional[int]:
        """Entries read into the buffers by the batch command; None where the kernel
        refuses it (then entry by entry from now on, logged once)."""
        if not self._batched:
            return None
        try:
            return self._lookup_all()
        except OSError as e:
            log.warning("%s: batch lookup refused (%s): reading entry by entry", self.name, e)
            self._batched = False
            return None

    def _lookup_all(self) -> int:
        token, count, total = ct.c_uint32(0), ct.c_uint32(0), 0
        ksz, vsz = ct.sizeof(self.Key), ct.sizeof(self.Leaf)
        while total < self._n:
            count.value = self._n - total
            res = lib.bpf_lookup_batch(self.table.map_fd, ct.byref(token) if total else None, ct.byref(token),
                                       ct.byref(self._keys, ksz * total), ct.byref(self._values, vsz * total),
                                       ct.byref(count))
            err = ct.get_errno()
            total += count.value
            if res != 0:
                if err == errno.ENOENT:  # the end of the map
                    return total
                raise OSError(err, "BPF_MAP_LOOKUP_BATCH: " + errno.errorcode.get(err, str(err)))
            if count.value == 0:
                break
        return total

    def delete(self, keys) -> list[bool]:
        """Deletes `keys` (Key objects, or bytes: keys back to back, as packed() gives them);
        for each, whether it was there (another reader may have taken it)."""
        ksz = ct.sizeof(self.Key)
        packed = isinstance(keys, (bytes, bytearray))
        n = len(keys) // ksz if packed else len(keys)
        done, i = [False] * n, 0
        if self._batched and n:
            arr = ct.create_string_buffer(bytes(keys), n * ksz) if packed else (self.Key * n)(*keys)
            while i < n:
                count = ct.c_uint32(n - i)
                res = lib.bpf_delete_batch(self.table.map_fd, ct.byref(arr, ksz * i), ct.byref(count))
                err = ct.get_errno()
                if res != 0 and err != errno.ENOENT:  # refused: `count` is left as it was asked
                    log.warning("%s: batch delete refused (%s): deleting entry by entry", self.name,
                                errno.errorcode.get(err, err))
                    self._batched = False
                    break
                done[i:i + count.value] = [True] * count.value
                i += count.value
                if res == 0:
                    return done
                i += 1  # the kernel stops at a key that is gone: skip it
            else:
                return done
        for j in range(i, n):
            key = self.Key.from_buffer_copy(keys, j * ksz) if packed else keys[j]
            try:
                del self.table[key]
                done[j] = True
            except KeyError:
                pass
        return done
