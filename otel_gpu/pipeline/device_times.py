"""Device-clock mode: GPU work as the device timed it, tied to the call that launched it.

The CUPTI injection library (cupti/otel_gpu_cupti.c) hands over each kernel, memcpy and memset
with its device start and end, and with three facts of its launching call taken inside that
call: its thread, when it entered (api_ns, CLOCK_MONOTONIC like every ts_ns here) and which
API it was (apis.py). The probes saw that call enter a moment before, on that thread. A
thread makes one call at a time, so the call is the thread's last streamed call that entered
at or before api_ns, and the tie holds only if that call is of that API (apis.may_be) and of
the activity's kind. Anything else is not tied, and counted by why (`device_untied_<why>`):

  unknown     the record names no launching call (its correlation entry was overwritten)
  api         its API is none we probe (cudaMemset, ...): no call of ours made it
  no_call     no streamed call of that thread entered before it (the process was not
              streaming: its calls were counted in the kernel, not sent one by one)
  other_call  the thread's last streamed call before it is another call: the record's own
              was counted in the kernel
  conflict    its call already holds another launch's record (a non-graph call makes one)

A record is never tied on timing alone, so a tie is never a guess; what it assumes is that
the thread's calls between the tied call and api_ns were all streamed (a call counted in the
kernel inside that gap, of the same API, would go unnoticed: `other_call` catches it only
when the streamed call before it was of another API).

Two stages. DeviceTimes, before the stitcher, sees every streamed call and every record, and
writes a tied record's interval into its call's device_ns (the call may already sit in a
request's sink: that is how it reaches the span). DeviceWait, after the stitcher, holds a
finished request of a process in device-clock mode until each of its launches, copies and
graph launches has its device times, or DEVICE_WAIT_S passes (counted: `device_times_late`),
and says which requests are complete (Request.device_busy, for pipeline/cost.py); a window of
calls no request owns (ambiguous, shared, outside) likewise."""
from __future__ import annotations

import bisect
import logging
import time
from typing import Optional

from ..cuda_calls import BY_ID
from ..device_clock.apis import ACTIVITY_OF, may_be
from ..ratelimit import RateLimitedLog, Stats
from ..records import CudaCall, DeviceClockSeen, DeviceRecords, GraphCall, ProcessGone, ProcExit, Tick
from .model import ProcessWindow, Request

log = logging.getLogger(__name__)

TIMELINE_NS = 30 * 10**9   # a thread's calls kept this long for the records that follow them
TIMELINE_MAX = 65536       # and at most this many per thread
DEVICE_WAIT_S = 2.0        # a request waits at most this long for its device times (records
                           # arrive within ~0.1 s of the work's end: the library's flush period)
UNTIED = {  # why -> what the log line says (the module docstring's table)
    "unknown": "it names no launching call",
    "api": "its launching API is none otel-gpu probes",
    "no_call": "its thread had no streamed call before it (its calls were counted in the kernel)",
    "other_call": "its thread's last streamed call is another (its own was counted in the kernel)",
    "conflict": "its call already holds another launch's record",
}


def device_mode_line(pid: int) -> str:
    """The line logged when pid is known to be in device-clock mode: its streamed calls are
    kept for the records from then on (the tests wait for it before their requests)."""
    return f"pid {pid}: its GPU work is timed by the device (device-clock mode)"


class DeviceTimes:
    """Stage, before the stitcher: ties device records to the calls that launched them."""

    def __init__(self, stats: Optional[Stats] = None) -> None:
        self.stats = stats or Stats()
        self._log = RateLimitedLog(log, self.stats, interval_s=60.0)
        # (tgid, tid) -> (entry times, calls) of its streamed calls, in entry order
        self._threads: dict[tuple[int, int], tuple[list, list]] = {}
        self._record_of: dict[int, int] = {}  # id(call) -> correlation id of its record (non-graph)
        self.device_procs: set[int] = set()

    def process(self, events: list) -> list:
        for ev in events:
            if isinstance(ev, CudaCall):
                if ev.tgid in self.device_procs:
                    self._remember(ev)
            elif isinstance(ev, DeviceRecords):
                self._device_mode(ev.tgid)
                self._tie(ev)
            elif isinstance(ev, DeviceClockSeen):
                self._device_mode(ev.tgid)
            elif isinstance(ev, ProcExit):
                self.device_procs.discard(ev.tgid)
                for key in [k for k in self._threads if k[0] == ev.tgid]:
                    self._forget(key, len(self._threads[key][1]))
            elif isinstance(ev, Tick):
                self._trim(ev.now_ns)
        return events

    def state(self) -> dict:
        return {"device_timeline_calls": sum(len(c) for _, c in self._threads.values())}

    def _remember(self, c: CudaCall) -> None:
        key = (c.tgid, c.tid)
        line = self._threads.get(key)
        if line is None:
            line = self._threads[key] = ([], [])
        if line[0] and c.ts_ns < line[0][-1]:  # never from one thread's ring order: kept sorted all the same
            i = bisect.bisect_right(line[0], c.ts_ns)
            line[0].insert(i, c.ts_ns)
            line[1].insert(i, c)
        else:
            line[0].append(c.ts_ns)
            line[1].append(c)
        if len(line[1]) > TIMELINE_MAX:
            self._forget(key, len(line[1]) - TIMELINE_MAX)

    def _forget(self, key: tuple, n: int) -> None:
        times, calls = self._threads[key]
        for c in calls[:n]:
            self._record_of.pop(id(c), None)
        del times[:n], calls[:n]
        if not calls:
            del self._threads[key]

    def _trim(self, now_ns: int) -> None:
        horizon = now_ns - TIMELINE_NS
        for key in list(self._threads):
            n = bisect.bisect_left(self._threads[key][0], horizon)
            if n:
                self._forget(key, n)

    def _device_mode(self, tgid: int) -> None:
        if tgid not in self.device_procs:
            self.device_procs.add(tgid)
            log.info("%s", device_mode_line(tgid))

    def _tie(self, batch: DeviceRecords) -> None:
        if batch.dropped:
            self.stats.add("device_records_dropped", batch.dropped)
        if batch.unreadable:
            self.stats.add("device_batches_unreadable")
        for a in batch.activities:
            why = self._tie_one(batch.tgid, a)
            if why is None:
                self.stats.add("device_tied")
            else:
                self._log.event(f"device_untied_{why}", logging.INFO, "pid %d: a device record is not tied to a "
                                "call, its time stays unattributed: %s", batch.tgid, UNTIED[why])

    def _tie_one(self, tgid: int, a) -> Optional[str]:
        """None when tied, else why not (the module docstring's table)."""
        if not a.tid or not a.api_ns or a.api == (0, 0):
            return "unknown"
        line = self._threads.get((tgid, a.tid))
        i = bisect.bisect_right(line[0], a.api_ns) - 1 if line else -1
        if i < 0:
            return "no_call"
        c = line[1][i]
        fits = may_be(a.api, c.call)
        if fits is None:
            return "api"
        spec = BY_ID.get(c.call)
        if not fits or spec is None or ACTIVITY_OF.get(spec.category) != a.kind:
            return "other_call"
        if type(c) is not GraphCall:
            held = self._record_of.setdefault(id(c), a.correlation_id)
            if held != a.correlation_id:
                return "conflict"
        c.device_ns = (*c.device_ns, (a.start_ns, a.end_ns))
        return None


def _waits_for(c: CudaCall) -> bool:
    if not c.device_ns:
        return True
    if type(c) is GraphCall and c.kernels:  # each kernel of the capture makes a record
        return len(c.device_ns) < sum(n for _f, n in c.kernels)
    return False


class DeviceWait:
    """Stage, after the stitcher: a finished request (or a window of calls no request owns) of
    a process in device-clock mode waits for its calls' device times (at most DEVICE_WAIT_S);
    then device_busy says them all, or None where some never came (its cost stays the
    host-side estimate). A process's waiting ones are looked at again when its records come,
    and the oldest of them as time passes: never all of them at every batch."""

    def __init__(self, stats: Optional[Stats] = None, clock=time.monotonic) -> None:
        self.device_procs: set[int] = set()  # as DeviceTimes learnt them, from the same records
        self._delivered: set[int] = set()    # ... of which these have handed records over
        self.stats = stats or Stats()
        self.clock = clock
        # tgid -> (since, request or window), in arrival order: the oldest is the first due
        self._held: dict[int, list[tuple[float, Request | ProcessWindow]]] = {}

    def process(self, records: list) -> list:
        out, news = [], set()
        for r in records:
            if isinstance(r, (Request, ProcessWindow)) and r.tgid in self.device_procs:
                self._held.setdefault(r.tgid, []).append((self.clock(), r))
                news.add(r.tgid)
            elif isinstance(r, (DeviceRecords, DeviceClockSeen)):
                self.device_procs.add(r.tgid)  # not passed on: no later stage reads them
                if isinstance(r, DeviceRecords):
                    self._delivered.add(r.tgid)
                news.add(r.tgid)
            elif isinstance(r, ProcessGone):
                self.device_procs.discard(r.tgid)
                self._delivered.discard(r.tgid)
                self._release(out, r.tgid, force=True)
                out.append(r)
            elif isinstance(r, Tick):
                for tgid in list(self._held):
                    self._release(out, tgid, force=r.final)
                out.append(r)
            else:
                out.append(r)
        for tgid in news & self._held.keys():  # only its records or a new request can complete one
            self._release(out, tgid)
        now = self.clock()
        for tgid, held in list(self._held.items()):  # the oldest first: past its wait, it goes late
            if held and now - held[0][0] >= DEVICE_WAIT_S:
                self._release(out, tgid)
        return out

    def state(self) -> dict:
        return {"held_for_device_times": sum(len(h) for h in self._held.values())}

    def _release(self, out: list, tgid: int, force: bool = False) -> None:
        now, keep = self.clock(), []
        for since, r in self._held.pop(tgid, ()):
            waiting = any(_waits_for(c) for c in r.sink.device_calls)
            if waiting and not force and now - since < DEVICE_WAIT_S and tgid in self.device_procs:
                keep.append((since, r))  # (a process found silent below lets the rest go too)
                continue
            if waiting:
                self.stats.add("device_times_late")
                if r.tgid not in self._delivered and r.tgid in self.device_procs:
                    # Loaded, yet silent: its library is off (CUPTI held by a profiler, the flag
                    # file not seen). Its requests stop waiting until records come.
                    self.device_procs.discard(r.tgid)
                    log.info("pid %d maps the device-clock library but has handed over no record: its "
                             "requests keep the host-side estimate until it does", r.tgid)
            elif r.sink.device_counted:
                self.stats.add("device_times_partial")  # some of its calls were counted, not streamed
            else:
                r.device_busy = tuple(iv for c in r.sink.device_calls for iv in c.device_ns)
            out.append(r)
        if keep:
            self._held[tgid] = keep
