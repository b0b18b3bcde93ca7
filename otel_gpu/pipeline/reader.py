"""The source of the pipeline: drains the ring buffer into batches of decoded records,
turns the in-kernel rollup map into KernelRollup records, and places the per-request
counts of the req_agg map (CallAggregate) in the batches where their HTTP epoch ended. It is handed the maps
by the program's owner (probes/program.py) and names none itself."""
from __future__ import annotations

import ctypes as ct
import logging
from typing import Optional

from ..ratelimit import RateLimitedLog, Stats
from .abi import RollupKey
from .decode import DecodeError, decode
from .records import CallAggregate, KernelRollup, ProcExit, SockClose, SockIo

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


def epoch_after(a: int, b: int) -> bool:
    """HTTP epoch `a` comes after `b` (u32 counters that wrap)."""
    return 0 < ((a - b) & 0xFFFFFFFF) < 0x80000000


class AggregateReader:
    """CallAggregate records from req_agg (bpf/cuda_probes.c). An entry is taken once its
    epoch has ended, i.e. the stream holds an HTTP record of its process with a later
    epoch (or the process exited, or the collector stops): then no call of it is still
    counting (but one whose probe read the epoch just before the HTTP probe bumped it,
    a window of nanoseconds, which then lands in a new entry: placed late and counted,
    `aggregates_late`). It goes just before that record, where its calls one by one would
    have been: the stitcher attributes it with the same open requests and contexts."""

    def __init__(self, table, stats: Stats) -> None:
        self.table = table
        self.stats = stats
        self.epochs: dict[int, int] = {}  # tgid -> latest HTTP epoch in the stream

    def merge(self, batch: list, final: bool = False) -> list:
        """`batch` with the aggregates whose epoch ended in or before it put in place."""
        before = dict(self.epochs)
        bounds: dict[int, list] = {}  # tgid -> [(epoch, index)] of its HTTP records
        exits: dict[int, int] = {}
        for i, r in enumerate(batch):
            cls = r.__class__
            if (cls is SockIo or cls is SockClose) and r.epoch:
                bounds.setdefault(r.tgid, []).append((r.epoch, i))
                last = self.epochs.get(r.tgid)
                if last is None or epoch_after(r.epoch, last):
                    self.epochs[r.tgid] = r.epoch
            elif cls is ProcExit and r.tgid not in exits:
                exits[r.tgid] = i
        if not (bounds or exits or final):
            return batch
        taken = self._take(exits, final)
        if not taken:
            return batch
        at: dict[int, list] = {}
        for a in taken:
            at.setdefault(self._place(a, bounds, exits, before, len(batch)), []).append(a)
        out: list = []
        for i, r in enumerate(batch):
            if i in at:
                out.extend(sorted(at.pop(i), key=lambda a: a.ts_ns))
            out.append(r)
        for i in sorted(at):
            out.extend(sorted(at[i], key=lambda a: a.ts_ns))
        return out

    def _take(self, exits: dict, final: bool) -> list[CallAggregate]:
        taken = []
        for k, v in list(self.table.items()):
            last = self.epochs.get(k.tgid)
            if not (final or k.tgid in exits or (last is not None and epoch_after(last, k.epoch))):
                continue  # its epoch is still running: calls may still be counting in it
            try:
                del self.table[k]
            except KeyError:
                continue
            taken.append(CallAggregate(k.tgid, k.tid, k.epoch, k.call, k.detail, k.ctx, v.count, v.bytes,
                                       v.duration_ns, v.first_ts, v.last_ts, v.last_end_ts))
        return taken

    def _place(self, a: CallAggregate, bounds: dict, exits: dict, before: dict, end: int) -> int:
        last = before.get(a.tgid)
        if last is not None and epoch_after(last, a.epoch):
            self.stats.add("aggregates_late", a.count)  # its epoch ended in an earlier batch
            return 0
        for epoch, i in bounds.get(a.tgid, ()):
            if epoch_after(epoch, a.epoch):
                return i
        return exits.get(a.tgid, end)  # at its exit, or (the collector stops) after everything

    def forget(self, tgids: set) -> None:
        for tgid in tgids:
            self.epochs.pop(tgid, None)
