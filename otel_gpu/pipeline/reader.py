"""Drains the ring buffer into batches of decoded records, and reads the BPF-side
counters and per-process rollups."""
from __future__ import annotations

import ctypes as ct
import logging

from ..ratelimit import RateLimitedLog, Stats
from .events import COUNTER_NAMES, DecodeError, RollupKey, decode

log = logging.getLogger(__name__)


class RingReader:
    """Batches are bounded (`max_batch` records): under a flood the poll returns, so
    the pipeline, flushes and discovery keep running and memory stays flat; the
    rest stays in the ring buffer for the next poll."""

    def __init__(self, bpf, stats: Stats, max_batch: int = 8192) -> None:
        self.bpf = bpf
        self.stats = stats
        self._log = RateLimitedLog(log, stats, interval_s=30.0)
        self._batch: list = []
        self.max_batch = max_batch
        self.full = False  # the last poll stopped at max_batch: more is waiting
        self.events_in = 0
        bpf["events"].open_ring_buffer(self._on_record)

    def _on_record(self, _ctx, data, size) -> int:
        self.events_in += 1
        try:  # decoded in place: the record's memory is valid during this call
            self._batch.append(decode((ct.c_char * size).from_address(data)))
        except DecodeError as e:
            self._log.event("decode_errors", logging.WARNING, "dropping undecodable event: %s", e)
        # A negative return stops libbpf's consume loop after this record.
        return -1 if len(self._batch) >= self.max_batch else 0

    def poll(self, timeout_ms: int) -> list:
        self.bpf.ring_buffer_poll(0 if self.full else timeout_ms)
        batch, self._batch = self._batch, []
        self.full = len(batch) >= self.max_batch
        return batch

    def counters(self) -> dict[str, int]:
        table = self.bpf["counters"]
        return {name: sum(table[ct.c_int(i)]) for i, name in enumerate(COUNTER_NAMES)}


class RollupReader:
    """Deltas of the in-kernel rollup map since the last read: (tgid, call, func,
    count, bytes, duration_ns)."""

    def __init__(self, bpf) -> None:
        self.table = bpf["rollup"]
        self._last: dict[tuple, tuple] = {}

    def deltas(self) -> list[tuple]:
        out = []
        for k, per_cpu in self.table.items():  # a per-CPU map: one value per CPU
            key = (k.tgid, k.call, k.func)
            now = (sum(v.count for v in per_cpu), sum(v.bytes for v in per_cpu),
                   sum(v.duration_ns for v in per_cpu))
            prev = self._last.get(key, (0, 0, 0))
            if now[0] != prev[0]:
                out.append(key + tuple(a - b for a, b in zip(now, prev)))
                self._last[key] = now
        return out

    def forget(self, tgid: int) -> None:
        """After a process exited and its last deltas were read."""
        for key in [k for k in self._last if k[0] == tgid]:
            del self._last[key]
            try:
                del self.table[RollupKey(*key)]
            except KeyError:
                pass
