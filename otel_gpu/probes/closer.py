"""Detaches uprobes off the collector's loop.

Closing a uprobe's perf event takes the kernel about 0.1 s (measured on 6.18: it
waits for a grace period with the tracing event mutex held, so closes do not overlap).
A process with ~27 probes of its own (--pid/--exe) would stall the loop for seconds
when it exits. The loop only disables the event (one ioctl: the program stops running
at once) and takes it out of bcc's table; this thread closes it."""
from __future__ import annotations

import fcntl
import logging
import os
import queue
import threading

log = logging.getLogger(__name__)

PERF_EVENT_IOC_DISABLE = 0x2401


class ProbeCloser:
    def __init__(self, bpf, stats) -> None:
        self.bpf = bpf
        self.stats = stats
        self._closing: queue.Queue = queue.Queue()
        self._pending = 0
        self._lock = threading.Lock()
        self._idle = threading.Event()
        self._idle.set()
        self._thread = threading.Thread(target=self._run, name="otel-gpu-probe-closer", daemon=True)
        self._thread.start()

    def detach(self, events: list) -> int:
        """Disables each of bcc's events now and closes them in the background; how many."""
        done = 0
        for ev in events:
            fd = self.bpf.uprobe_fds.get(ev)
            if fd is None:
                continue
            try:
                fcntl.ioctl(fd, PERF_EVENT_IOC_DISABLE, 0)
            except OSError as e:
                self.stats.add("probe_detach_failed")
                log.warning("cannot disable uprobe %s: %s", ev.decode(errors="replace"), e)
                continue
            _forget(self.bpf, ev)
            with self._lock:
                self._pending += 1
                self._idle.clear()
            self._closing.put((ev, fd))
            done += 1
        return done

    def pending(self) -> int:
        with self._lock:
            return self._pending

    def wait(self, timeout: float) -> bool:
        """True once every queued event is closed."""
        return self._idle.wait(timeout)

    def _run(self) -> None:
        from bcc import lib
        while True:
            ev, fd = self._closing.get()
            try:
                os.close(fd)
                lib.bpf_detach_uprobe(ev)  # a no-op for perf-PMU probes; tracefs ones are removed
            except OSError as e:
                self.stats.add("probe_detach_failed")
                log.warning("cannot close uprobe %s: %s", ev.decode(errors="replace"), e)
            with self._lock:
                self._pending -= 1
                if not self._pending:
                    self._idle.set()


def _forget(bpf, ev: bytes) -> None:
    """bcc's own bookkeeping (its open-probe count too) without closing the descriptor."""
    forget = getattr(bpf, "_del_uprobe_fd", None)
    if forget is not None:
        forget(ev)
    else:
        del bpf.uprobe_fds[ev]
