"""Where a request's time went: on the CPU, waiting for a CPU, waiting on the GPU inside a
synchronising call, or blocked otherwise (bpf/thread_times.c keeps each traced thread's
sums; its socket records carry them, SockIo.times).

A request is split on its serving thread, the one that read its head: the thread's sums
at its answer minus those at its first read. Only where the answer is written by that
same thread (else there is no split: the span says nothing). Both records' times are
those of the records themselves, so the parts add up to the span's duration, never more.

The split is the serving thread's, which is the request's own only where that thread
served it alone: no other request open on the thread meanwhile (an asyncio loop, a
batcher) and no call of the request made on another thread (a worker pool). Otherwise it
is still given, flagged `shared` (the unit's split, not the request's): never guessed
into a share."""
from __future__ import annotations

from collections import OrderedDict, deque
from typing import Optional

from ..records import SockIo

PARTS = ("on_cpu", "cpu_wait", "gpu_sync", "blocked")  # bpf/events.h enum time_part, in order
RECENT = 16  # records remembered per thread: a head's first read is a few records back at most
MAX_THREADS = 1024  # threads remembered per process, the least recently seen dropped (a thread per connection)


class ThreadTimes:
    """Per process: each thread's latest time sums, by record time, and its open requests."""

    __slots__ = ("_recent", "_open")

    def __init__(self) -> None:
        self._recent: OrderedDict[int, deque] = OrderedDict()  # tid -> (ts, times) of its latest records
        self._open: dict[int, list] = {}     # tid -> requests it serves now

    def seen(self, ev: SockIo) -> None:
        if ev.times is None:
            return
        recent = self._recent.get(ev.tid)
        if recent is None:
            if len(self._recent) >= MAX_THREADS:
                self._recent.popitem(last=False)
            recent = self._recent[ev.tid] = deque(maxlen=RECENT)
        else:
            self._recent.move_to_end(ev.tid)
        recent.append((ev.ts_ns, ev.times))

    def _at(self, tid: int, ts: int) -> Optional[tuple]:
        for at, times in reversed(self._recent.get(tid, ())):
            if at == ts:
                return times
        return None

    def opened(self, req) -> None:
        req.times_start = self._at(req.tid, req.start_ns)
        serving = self._open.setdefault(req.tid, [])
        serving.append(req)
        if len(serving) > 1:  # the thread serves several at once: none of them alone
            for r in serving:
                r.time_shared = True

    def finished(self, req, ts: int) -> None:
        serving = self._open.get(req.tid)
        if serving is not None and req in serving:
            serving.remove(req)
            if not serving:
                del self._open[req.tid]
        start, end = req.times_start, self._at(req.tid, ts)
        if start is None or end is None:
            return
        req.time_split = tuple(max(0, b - a) for a, b in zip(start, end))
        if any(c.tid != req.tid for c, _ in req.sink.calls):
            req.time_shared = True  # its work ran on other threads too
