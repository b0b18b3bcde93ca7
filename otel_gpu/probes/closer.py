"""Detaches probes off the collector's loop, many at a time: uprobe_multi links
(probes/uprobe_links.py), and perf events (bcc's uprobes and tracepoints).

A link's close detaches it (one grace period; closes overlap: 60 links in 0.07 s from
64 threads, measured on 6.18).

Closing a uprobe's or tracepoint's perf event takes the kernel 0.1-0.25 s (measured on
6.18: grace periods, part of them under the tracing event mutex). One after another,
the 127 probes of an idle collector took ~12 s to detach at exit. Closed from WORKERS
threads, the parts outside the mutex overlap: 97 uprobes took 9.7 s instead of 24 s on
the loaded 2-core VM (bench figure in README Performance). The caller only disables
each event (one ioctl: the program stops running at once) and takes it out of bcc's
tables; the workers close it."""
from __future__ import annotations

import fcntl
import logging
import os
import queue
import threading
from typing import Optional

from .uprobe_links import LinkFd

log = logging.getLogger(__name__)

PERF_EVENT_IOC_DISABLE = 0x2401
WORKERS = 64  # perf uprobes: no gain past ~16 (8: 12.4 s, 32: 9.7 s, 64: 9.3 s); links: 16: 0.28 s, 64: 0.07 s
# bcc makes a uprobe through tracefs only where the kernel has no uprobe PMU; such an
# event must also be removed from this file. Read once per batch, by a closer thread,
# not once per probe as bcc's bpf_detach_uprobe does (each read waits for the event
# mutex, which the closes hold: the loop must not wait there).
UPROBE_EVENTS = ("/sys/kernel/tracing/uprobe_events", "/sys/kernel/debug/tracing/uprobe_events")


class ProbeCloser:
    def __init__(self, bpf, stats, workers: int = WORKERS) -> None:
        self.bpf = bpf
        self.stats = stats
        self._closing: queue.Queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._links = 0  # links queued and not yet closed
        self._links_done = threading.Condition(self._lock)
        self._workers = workers
        self._threads: list[threading.Thread] = []

    def detach(self, events: list) -> int:
        """Closes each link, and disables each of bcc's uprobe events now, in the
        background; how many. A link runs until its close: wait_links() for that."""
        batch = _Batch()
        done = 0
        for ev in events:
            if isinstance(ev, LinkFd):
                self._enqueue(b"uprobe_multi link %d" % ev, int(ev), None, link=True)
                done += 1
                continue
            fd = self.bpf.uprobe_fds.get(ev)
            if fd is None or not self._disable(fd, "uprobe", ev):
                continue
            _forget(self.bpf, ev)
            self._enqueue(ev, fd, batch)
            done += 1
        return done

    def detach_all(self, links: list = ()) -> int:
        """`links` and every uprobe and tracepoint bcc still holds, disabled now (links:
        closing), closed in the background (wait() for them); how many."""
        n = self.detach(list(links) + list(self.bpf.uprobe_fds))
        for tp, fd in list(self.bpf.tracepoint_fds.items()):
            if self._disable(fd, "tracepoint", tp):
                del self.bpf.tracepoint_fds[tp]  # bcc's bpf_detach_tracepoint does nothing more
                self._enqueue(tp, fd, None)
                n += 1
        return n

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def wait(self, timeout: float) -> bool:
        """True once every queued event is closed."""
        return self._idle.wait(timeout)

    def wait_links(self, timeout: float) -> bool:
        """True once every queued link is closed: their programs run no more."""
        with self._links_done:
            return self._links_done.wait_for(lambda: not self._links, timeout)

    def _disable(self, fd: int, kind: str, name: bytes) -> bool:
        try:
            fcntl.ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
            return True
        except OSError as e:
            self.stats.add("probe_detach_failed")
            log.warning("cannot disable %s %s: %s", kind, name.decode(errors="replace"), e)
            return False

    def _enqueue(self, name: bytes, fd: int, batch: "Optional[_Batch]", link: bool = False) -> None:
        with self._lock:
            self._pending += 1
            self._links += link
            self._idle.clear()
            if len(self._threads) < min(self._workers, self._pending):  # started as needed
                t = threading.Thread(target=self._run, name=f"otel-gpu-probe-closer-{len(self._threads)}",
                                     daemon=True)
                self._threads.append(t)
                t.start()
        self._closing.put((name, fd, batch, link))

    def _run(self) -> None:
        from bcc import lib
        while True:
            name, fd, batch, link = self._closing.get()
            try:
                os.close(fd)
                if batch is not None and batch.in_tracefs(name) and lib.bpf_detach_uprobe(name) < 0:
                    raise OSError(f"cannot remove it from {UPROBE_EVENTS[0]}")
            except OSError as e:
                self.stats.add("probe_detach_failed")
                log.warning("cannot close probe %s: %s", name.decode(errors="replace"), e)
            with self._lock:
                self._pending -= 1
                self._links -= link
                if not self._links:
                    self._links_done.notify_all()
                if not self._pending:
                    self._idle.set()


class _Batch:
    """The uprobes of one detach call: uprobe_events as read once for all of them."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._text: Optional[str] = None

    def in_tracefs(self, name: bytes) -> bool:
        with self._lock:
            if self._text is None:
                self._text = _tracefs_events()
        return name.decode(errors="replace") in self._text


def _tracefs_events() -> str:
    for path in UPROBE_EVENTS:
        try:
            with open(path) as f:
                return f.read()
        except OSError:
            continue
    return ""


def _forget(bpf, ev: bytes) -> None:
    """bcc's own bookkeeping (its open-probe count too) without closing the descriptor."""
    forget = getattr(bpf, "_del_uprobe_fd", None)
    if forget is not None:
        forget(ev)
    else:
        del bpf.uprobe_fds[ev]
