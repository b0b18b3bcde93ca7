"""The source of the pipeline: drains the ring buffer into batches of decoded records,
and turns the in-kernel rollup map into KernelRollup records. It is handed the maps
by the program's owner (probes/program.py) and names none itself."""
from __future__ import annotations

import ctypes as ct
import logging
from typing import Optional

from ..ratelimit import RateLimitedLog, Stats
from .abi import RollupKey
from .decode import DecodeError, decode
from .records import KernelRollup, ProcExit

log = logging.getLogger(__name__)


class RingReader:
    """Batches are bounded (`max_batch` records): under a flood the poll returns, so
    the pipeline, flushes and discovery keep running and memory stays flat; the
    rest stays in the ring buffer for the next poll."""

    def __init__(self, bpf, ring_name: str, stats: Stats, max_batch: int = 8192) -> None:
        self.bpf = bpf
        self.stats = stats
        self._log = RateLimitedLog(log, stats, interval_s=30.0)
        self._batch: list = []
        self.max_batch = max_batch
        self.full = False  # the last poll stopped at max_batch: more is waiting
        self.first_exit = -1  # index of the first ProcExit in the batch being read
        self.events_in = 0
        bpf[ring_name].open_ring_buffer(self._on_record)

    def _on_record(self, _ctx, data, size) -> int:
        self.events_in += 1
        try:  # decoded in place: the record's memory is valid during this call
            record = decode((ct.c_char * size).from_address(data))
        except DecodeError as e:
            self._log.event("decode_errors", logging.WARNING, "dropping undecodable event: %s", e)
        else:
            if record.__class__ is ProcExit and self.first_exit < 0:
                self.first_exit = len(self._batch)
            self._batch.append(record)
        # A negative return stops libbpf's consume loop after this record.
        return -1 if len(self._batch) >= self.max_batch else 0

    def poll(self, timeout_ms: int) -> tuple[list, int]:
        """(records, index of the first process exit in them or -1)."""
        self.bpf.ring_buffer_poll(0 if self.full else timeout_ms)
        batch, self._batch = self._batch, []
        first_exit, self.first_exit = self.first_exit, -1
        self.full = len(batch) >= self.max_batch
        return batch, first_exit


class RollupReader:
    """KernelRollup records: what the rollup map counted since the last read."""

    def __init__(self, table) -> None:
        self.table = table
        self._last: dict[tuple, tuple] = {}
        self._read_ns: Optional[int] = None

    def read(self, now_ns: int) -> list[KernelRollup]:
        out = []
        for k, per_cpu in self.table.items():  # a per-CPU map: one value per CPU
            key = (k.tgid, k.call, k.detail)
            now = (sum(v.count for v in per_cpu), sum(v.bytes for v in per_cpu),
                   sum(v.duration_ns for v in per_cpu))
            prev = self._last.get(key, (0, 0, 0))
            if now[0] != prev[0]:
                count, nbytes, duration = (a - b for a, b in zip(now, prev))
                out.append(KernelRollup(k.tgid, k.call, k.detail, count, nbytes, duration,
                                        now_ns, self._read_ns))
                self._last[key] = now
        self._read_ns = now_ns
        return out

    def forget(self, tgids: set) -> None:
        """After processes exited and their last counts were read."""
        for key in [k for k in self._last if k[0] in tgids]:
            del self._last[key]
            try:
                del self.table[RollupKey(*key)]
            except KeyError:
                pass

    def __len__(self) -> int:
        return len(self.table)
