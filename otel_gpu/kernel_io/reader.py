"""The source of the pipeline: drains the ring buffer into batches of decoded records,
turns the in-kernel rollup map into KernelRollup records, and places the per-request
counts of the req_agg map (CallAggregate) in the batches where their HTTP epoch ended. It is handed the maps
by the program's owner (kernel_io/program.py) and names none itself."""
from __future__ import annotations

import bisect
import ctypes as ct
import logging
import threading
from typing import Optional

from ..cuda_calls import call_id
from ..ratelimit import RateLimitedLog, Stats
from ..records import (AggregateRun, CallAggregate, ContextCopy, GoH2Unit, KernelRollup, LibraryLoaded, ProcExit,
                       SockClose, SockIo, UnitWake)
from .abi import AGG_HTTP_UNSEEN, RollupKey
from .decode import DecodeError, decode
from .kept_counts import EPOCH_WORD, KEY, KEY_WORDS, TGID_WORD, VALUE, KeptCounts
from .launch_slots import LaunchSlots

log = logging.getLogger(__name__)
LAUNCH_KERNEL = call_id("cudaLaunchKernel")  # the call the launch slots count
# Counts kept in memory until the stream reaches their epoch's end (AggregateReader): four
# times what req_agg holds (bpf/maps.h AGG_ENTRIES), 84 bytes each (22 MB); past it they
# wait in req_agg as before, and what it cannot take is lost and counted (agg_full).
MAX_KEPT = 262_144


class RingReader:
    """Batches are bounded (`max_batch` records): under a flood the poll returns, so
    the pipeline, flushes and discovery keep running and memory stays flat; the
    rest stays in the ring buffer for the next poll."""

    def __init__(self, bpf, ring_name: str, stats: Stats, max_batch: int = 8192, size: int = 0) -> None:
        """`size`: the ring buffer's bytes (half_full)."""
        self.bpf = bpf
        self.size = size
        self._bytes = 0  # of the batch being read
        self.unread_rate = 0.0  # bytes a ns the last batch's records were made at
        self.newest_ns = 0  # the last batch's newest record
        self.stats = stats
        self._log = RateLimitedLog(log, stats, interval_s=30.0)
        self._batch: list = []
        self.max_batch = max_batch
        self.full = False  # the last poll stopped at max_batch: more is waiting
        self.first_exit = -1  # index of the first ProcExit in the batch being read
        self.library_loaded = False  # a LibraryLoaded came: the `loaded` table has news (reset by its reader)
        bpf[ring_name].open_ring_buffer(self._on_record)

    def _on_record(self, _ctx, data, size) -> int:
        try:  # decoded in place: the record's memory is valid during this call
            record = decode((ct.c_char * size).from_address(data))
        except DecodeError as e:
            self._log.event("decode_errors", logging.WARNING, "dropping undecodable event: %s", e)
        else:
            if record.__class__ is LibraryLoaded:
                self.library_loaded = True  # a cue, not a record for the pipeline
                return 0
            if record.__class__ is ProcExit and self.first_exit < 0:
                self.first_exit = len(self._batch)
            self._batch.append(record)
            self._bytes += size
        # A negative return stops libbpf's consume loop after this record.
        return -1 if len(self._batch) >= self.max_batch else 0

    def unread(self, now_ns: int) -> float:
        """Bytes the ring buffer holds unread, as estimated from the last batch: full (the
        collector is behind), its records made at `unread_rate`, the newest at newest_ns."""
        return self.unread_rate * max(now_ns - self.newest_ns, 0)

    def half_full(self, now_ns: int) -> bool:
        return self.unread(now_ns) > self.size // 2

    def poll(self, timeout_ms: int) -> tuple[list, int]:
        """(records, index of the first process exit in them or -1)."""
        self.bpf.ring_buffer_poll(0 if self.full else timeout_ms)
        batch, self._batch = self._batch, []
        first_exit, self.first_exit = self.first_exit, -1
        self.full = len(batch) >= self.max_batch
        if batch:
            self.newest_ns = getattr(batch[-1], "ts_ns", 0)
        span = self.newest_ns - getattr(batch[0], "ts_ns", 0) if batch else 0
        self.unread_rate = self._bytes / span if self.full and span > 0 else 0.0
        self._bytes = 0
        if batch:
            self.stats.add("ring_records", len(batch))
        return batch, first_exit


class RollupReader:
    """KernelRollup records: what the rollup map counted since the last read."""

    def __init__(self, table, slots: Optional[LaunchSlots] = None) -> None:
        """`slots`: the launch fast path's per-CPU counts (bpf/launch_slots.c), which
        hold the launches of a (tgid, kernel) that `table` did not count."""
        self.table = table
        self.slots = slots
        self._last: dict[tuple, tuple] = {}
        self._read_ns: Optional[int] = None

    def read(self, now_ns: int) -> list[KernelRollup]:
        launched = self.slots.read() if self.slots else {}  # (tgid, func) -> launches
        out = []
        for k, v in self.table.items():  # cumulative counts: the deltas since the last read go out
            key = (k.tgid, k.call, k.detail)
            now = (v.count, v.bytes, v.duration_ns)
            prev = self._last.get(key, (0, 0, 0))
            count, nbytes, duration = (a - b for a, b in zip(now, prev))
            if k.call == LAUNCH_KERNEL:
                count += launched.pop((k.tgid, k.detail), 0)
            if count:
                out.append(KernelRollup(k.tgid, k.call, k.detail, count, nbytes, duration,
                                        now_ns, self._read_ns))
                self._last[key] = now
        out += [KernelRollup(tgid, LAUNCH_KERNEL, func, n, 0, 0, now_ns, self._read_ns)
                for (tgid, func), n in launched.items()]
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


_NOW, _KEEP, _LEAVE = 0, 1, 2  # what a read of req_agg does with a (process, epoch)'s rows


def epoch_after(a: int, b: int) -> bool:
    """HTTP epoch `a` comes after `b` (u32 counters that wrap)."""
    return 0 < ((a - b) & 0xFFFFFFFF) < 0x80000000


class AggregateReader:
    """CallAggregate records from req_agg (bpf/call_out.c). An entry is taken once its
    epoch has ended, i.e. the stream holds an HTTP record or a binding of an execution
    unit (ContextCopy, UnitWake, GoH2Unit) of its process with a later epoch (or the process exited, or the collector stops): then no call of it is still
    counting (but one whose probe read the epoch just before the HTTP probe bumped it,
    a window of nanoseconds, which then lands in a new entry: placed late and counted,
    `aggregates_late`). It goes just before that record, where its calls one by one would
    have been: the stitcher attributes it with the same open requests and contexts.

    A collector behind its load reads records made a while ago, while the kernel counts
    the calls of every request made since: the table would hold the counts of the whole
    backlog (dozens a request where requests launch dozens of kernels) and fill. So an
    entry whose epoch the kernel had moved past by the end of the previous read
    (`kernel_epoch`, read then for the processes it found counting: an entry is read
    whole only once no call adds to it) is taken and kept here (up to MAX_KEPT) until the
    stream reaches that epoch's end, by merge() and by collect(), which a thread calls while
    the pipeline works through a batch (kernel_io/count_collector.py): the table holds the counts of
    the epochs still running. A call that lands after its entry was taken makes a new one,
    taken the same way, and both go to the same place.

    `table`: packed() -> (keys, values), every entry's abi.AggKey and AggValue back to back
    as the kernel lays them out, and delete(keys) -> [deleted?] for keys packed alike
    (kernel_io/map_batch.py: the kernel's batch commands).
    `counted()`: calls the kernel counted in req_agg so far (it bumps that counter after
    the entry is written): while it has not moved and no process with entries left has a
    new epoch, the map is not read at all. `kernel_epoch(tgid)`: the process's epoch in
    the kernel now (bpf/maps.h http_seq), or None."""

    def __init__(self, table, stats: Stats, counted=None, kernel_epoch=None) -> None:
        self.table = table
        self.stats = stats
        self.counted = counted
        self.kernel_epoch = kernel_epoch
        self.epochs: dict[int, int] = {}  # tgid -> latest HTTP epoch in the stream
        self._counted_seen: Optional[int] = None
        self._waiting: set = set()  # tgids whose entries were left (their epoch ran on)
        self.kept = KeptCounts(MAX_KEPT)  # counts taken before the stream reached their epoch's end
        self._kernel_then: dict[int, int] = {}  # tgid -> its kernel epoch, read after the previous read
        # Set while the ring buffer is half full (kernel_io/program.py poll): the collector is
        # past its load, and what it keeps it must also place. Left in the kernel, counts fill
        # req_agg and are shed there (counted), not the ring's room for HTTP records.
        self.shedding = False
        self._lock = threading.Lock()  # collect() runs on a thread of its own

    def collect(self) -> None:
        """Takes every entry whose epoch the kernel has moved past, to be placed by a later
        merge(). One whose epoch the stream had already passed (a call that landed after
        its entry was taken) goes first in that merge's batch, counted late."""
        with self._lock:
            self._take({}, {}, False, keep_all=True)

    def merge(self, batch: list, final: bool = False) -> list:
        """`batch` with the aggregates whose epoch ended in or before it put in place."""
        with self._lock:
            return self._merge(batch, final)

    def _merge(self, batch: list, final: bool) -> list:
        before = dict(self.epochs)
        bounds: dict[int, list] = {}  # tgid -> [(epoch, index)] of its epoch records
        exits: dict[int, int] = {}
        epochs = self.epochs
        for i, r in enumerate(batch):
            cls = r.__class__
            if (cls is SockIo or cls is SockClose or cls is ContextCopy or cls is UnitWake or cls is GoH2Unit) and r.epoch:
                tgid, epoch = r.tgid, r.epoch
                b = bounds.get(tgid)
                if b is None:
                    bounds[tgid] = [(epoch, i)]
                else:
                    b.append((epoch, i))
                last = epochs.get(tgid)
                if last is None or epoch_after(epoch, last):
                    epochs[tgid] = epoch
            elif cls is ProcExit and r.tgid not in exits:
                exits[r.tgid] = i
        if not (bounds or exits or final):
            return batch
        taken = self._take(bounds, exits, final)
        if self.kept:
            taken += self._due(exits, final)
        if not taken:
            return batch
        at: dict[int, list] = {}
        places = _Places(bounds, exits, before, len(batch))
        for a in taken:
            i = places.index(a)
            if i < 0:
                self.stats.add("aggregates_late", a.count)  # its epoch ended in an earlier batch
                i = 0
            at.setdefault(i, []).append(a)
        out: list = []
        prev = 0
        for i in sorted(at):
            out += batch[prev:i]
            out += runs(at[i])
            prev = max(prev, i)
        out += batch[prev:]
        return out

    def _take(self, bounds: dict, exits: dict, final: bool, keep_all: bool = False) -> list[CallAggregate]:
        """The entries whose epoch ended in the stream, out of the table; those whose epoch
        ended in the kernel only go to `kept` (all of them with `keep_all`)."""
        counted = self.counted() if self.counted is not None else None
        if (counted is not None and counted == self._counted_seen and not (final or exits)
                and self._waiting.isdisjoint(bounds)):
            return []  # nothing new counted, and no entry left behind has seen its epoch end
        keys, values = self.table.packed()
        words = memoryview(keys).cast("I")  # the key's tgid and epoch columns, no row unpacked
        tgids, row_epochs = words[TGID_WORD::KEY_WORDS].tolist(), words[EPOCH_WORD::KEY_WORDS].tolist()
        # Each (process, epoch) decided once: taken now (its epoch ended in the stream), kept
        # (it ended in the kernel only, by the end of the previous read: no call adds to it any
        # more, but one whose probe read the epoch before it moved on and was preempted since,
        # which then lands in a new entry, taken the same way), or left (still running).
        epochs, kernel, verdicts = self.epochs, self._kernel_then, {}
        for pair in dict.fromkeys(zip(tgids, row_epochs)):
            tgid, epoch = pair
            last = epochs.get(tgid)
            if final or tgid in exits or (last is not None and epoch_after(last, epoch)):
                verdicts[pair] = _NOW
            else:
                moved = kernel.get(tgid)
                verdicts[pair] = _KEEP if moved is not None and epoch_after(moved, epoch) else _LEAVE
        at = {_NOW: [], _KEEP: [], _LEAVE: []}
        for i, pair in enumerate(zip(tgids, row_epochs)):
            at[verdicts[pair]].append(i)
        now, later = at[_NOW], at[_KEEP]
        room = 0 if self.shedding else self.kept.room()
        left = at[_LEAVE] + later[room:]
        later = later[:room]
        counting = set(tgids)
        self._counted_seen, self._waiting = counted, {tgids[i] for i in left}
        if self.kernel_epoch is not None:  # after the table: what the next read may take
            self._kernel_then = {t: e for t in counting if t in epochs and (e := self.kernel_epoch(t)) is not None}
        if not (now or later):
            return []
        if keep_all:
            now, later = [], now + later
        ks, vs = KEY.size, VALUE.size
        gone = self.table.delete(b"".join([keys[i * ks:(i + 1) * ks] for i in now + later]))
        taken = [_aggregate(KEY.unpack_from(keys, i * ks) + VALUE.unpack_from(values, i * vs))
                 for i, g in zip(now, gone) if g]
        kept = [i for i, g in zip(later, gone[len(now):]) if g]
        self.kept.add(keys, values, kept, tgids, row_epochs)
        if taken or kept:
            self.stats.add("aggregate_records", len(taken) + len(kept))
        return taken

    def _due(self, exits: dict, final: bool) -> list[CallAggregate]:
        """The kept counts whose epoch has now ended in the stream (all of a process that
        exited; all when the collector stops)."""
        out: list = []
        for tgid in self.kept.tgids():
            last = self.epochs.get(tgid)
            if final or tgid in exits:
                rows = self.kept.take(tgid, lambda e: True)
            elif last is None:
                continue
            else:
                rows = self.kept.take(tgid, lambda e: epoch_after(last, e))
            out += [_aggregate(row) for row in rows]
        return out

    def forget(self, tgids: set) -> None:
        with self._lock:  # collect() reads the epochs and the kept counts on its thread
            for tgid in tgids:
                self.epochs.pop(tgid, None)
                self._kernel_then.pop(tgid, None)
                self.kept.forget(tgid)


def _ts(a: CallAggregate) -> int:
    return a.ts_ns


def _aggregate(f: tuple) -> CallAggregate:
    """A req_agg row as a record. f: abi.AggKey's fields (tgid, tid, epoch, call, detail,
    ctx), then AggValue's (count, bytes, duration_ns, first_ts, last_ts, last_end_ts): the
    record's first fields, in its order."""
    if f[3] & AGG_HTTP_UNSEEN:
        return CallAggregate(f[0], f[1], f[2], f[3] & ~AGG_HTTP_UNSEEN, *f[4:], http_unseen=True)
    return CallAggregate(*f)


def runs(aggregates: list) -> list[AggregateRun]:
    """Aggregates placed in one spot as runs of one thread, unit and epoch each, in the
    order of their first calls and each in time order. Between the same two records of
    their process no rule reads how different threads' calls interleave (each is decided
    by the requests open and its own thread's facts), so one thread's run is not cut by
    another's."""
    if len(aggregates) == 1:
        a = aggregates[0]
        return [AggregateRun(a.tgid, a.tid, a.epoch, a.ctx, a.http_unseen, aggregates)]
    by_key: dict[tuple, list] = {}
    for a in sorted(aggregates, key=_ts):
        key = (a.tgid, a.tid, a.epoch, a.ctx, a.http_unseen)
        run = by_key.get(key)
        if run is None:
            by_key[key] = [a]
        else:
            run.append(a)
    return [AggregateRun(*key, run) for key, run in by_key.items()]


def _rel(epoch: int, base: int) -> int:
    """`epoch` relative to `base` as a signed distance (u32 epochs wrap)."""
    d = (epoch - base) & 0xFFFFFFFF
    return d - 0x100000000 if d >= 0x80000000 else d


class _Places:
    """Where each aggregate goes in one batch: before the first epoch record of its process
    with a later epoch, else at its exit, else at the end. Per process, the running maximum
    of its epochs is increasing: a bisection finds that record (linear in the batch, once)."""

    def __init__(self, bounds: dict, exits: dict, before: dict, end: int) -> None:
        self.bounds, self.exits, self.before, self.end = bounds, exits, before, end
        self._maxima: dict[int, tuple] = {}
        self._found: dict[tuple, int] = {}

    def index(self, a: CallAggregate) -> int:
        """-1: its epoch had already ended before this batch (placed first, counted late)."""
        key = (a.tgid, a.epoch)
        i = self._found.get(key)
        if i is None:
            i = self._found[key] = self._index(a.tgid, a.epoch)
        return i

    def _index(self, tgid: int, epoch: int) -> int:
        last = self.before.get(tgid)
        if last is not None and epoch_after(last, epoch):
            return -1
        b = self.bounds.get(tgid)
        if b:
            m = self._maxima.get(tgid)
            if m is None:
                m = self._maxima[tgid] = self._running_max(b)
            base, rels, where = m
            k = bisect.bisect_right(rels, _rel(epoch, base))
            if k < len(rels):
                return where[k]
        return self.exits.get(tgid, self.end)  # at its exit, or (the collector stops) after everything

    @staticmethod
    def _running_max(b: list) -> tuple:
        base, rels, where, top = b[0][0], [], [], None
        for epoch, i in b:
            r = _rel(epoch, base)
            if top is None or r > top:
                top = r
                rels.append(r)
                where.append(i)
        return base, rels, where
