"""The collector's side of `otel-gpu status`: every few seconds, one JSON object with
what it is doing (processes traced, probes, request rate, counters, export state),
written atomically (file.py); at the end, the same with `stopped_at`, kept: the final
counts of the run (what the `stopped:` log line says), for an operator and for the
bench and tests. Never raises into the collector: a failed write is logged
(rate-limited) and counted as `status_write_errors`."""
from __future__ import annotations

import logging
import os
import time
from typing import Callable, Optional

from .. import __version__, proc, sanitize
from ..kernel_io import map_memory
from ..ratelimit import RateLimitedLog, Stats
from .file import INTERVAL_S, SCHEMA, read_state, write_atomic

log = logging.getLogger(__name__)

MAX_PROCESSES = 100  # listed by pid and name; the count is always exact
MAP_MEMORY_EVERY_S = 30.0  # the maps' memory moves only as by-need tables fill


def destination_counts(name: str, exporter, stats: dict, handed: int) -> dict:
    """What each kind of destination can tell: spans that went out and spans that did
    not. `handed`: spans given to every destination (Destinations.spans_out)."""
    errors = stats.get(f"{name}_export_errors", 0)  # calls that raised (Destinations)
    if hasattr(exporter, "pending"):  # OTLP behind the batch queue
        return {"spans_exported": stats.get("spans_exported", 0),
                "spans_failed": stats.get("spans_export_failed", 0) + stats.get("spans_dropped_queue_full", 0),
                "pending": exporter.pending}
    if hasattr(exporter, "write_errors"):  # the local store: failed transactions, not spans
        return {"spans_exported": exporter.spans_written, "requests_summed": exporter.requests_summed,
                "write_errors": exporter.write_errors + errors}
    return {"spans_exported": handed, "write_errors": errors}


def probe_status(program) -> dict:
    """Uprobes by function: how many times each is attached (once per file, or per file
    and process with --pid/--exe), and each failure to attach one (a symbol a library
    does not define is not a failure); the functions whose probe x86 single-steps, with
    their files (probes/prologue.py: each call pays SINGLE_STEP_COST); the processes whose
    runtime launches are counted at the driver's probe alone, and at the runtime's
    (probes/launch_routes.py)."""
    a = program.attacher
    return {"tracepoints": program.tracepoints(), "files": a.files(),
            "attached": dict(a.by_symbol), "failed": dict(a.failed),
            "single_stepped": {s: sorted(files) for s, files in sorted(a.single_stepped.items()) if files},
            "launch_routes": program.launch_routes.state()}


class ExportHealth:
    """ok / failing per destination, from how its counts moved since the last write:
    failing when only failures grew, ok again as soon as something goes out. "since"
    is the write at which it was first seen failing (INTERVAL_S resolution)."""

    def __init__(self) -> None:
        self._last: dict[str, tuple[int, int]] = {}
        self._failing_since: dict[str, float] = {}

    def update(self, name: str, counts: dict, now: float) -> dict:
        ok = counts.get("spans_exported", 0) + counts.get("requests_summed", 0)  # the store sums some
        bad = counts.get("spans_failed", 0) + counts.get("write_errors", 0)
        last_ok, last_bad = self._last.get(name, (0, 0))
        self._last[name] = (ok, bad)
        if ok > last_ok:
            self._failing_since.pop(name, None)
        elif bad > last_bad:
            self._failing_since.setdefault(name, now)
        since = self._failing_since.get(name)
        state = "failing" if since is not None else "ok" if ok or bad else "idle"
        return {"name": name, "state": state, "failing_since": since, **counts}


class RequestRate:
    """Requests per second over the last interval, from the requests_finished counter."""

    def __init__(self) -> None:
        self._last: Optional[tuple[float, int]] = None

    def update(self, total: int, now: float) -> float:
        last, self._last = self._last, (now, total)
        if last is None or now <= last[0]:
            return 0.0
        return round((total - last[1]) / (now - last[0]), 2)


class StatusWriter:
    def __init__(self, path: str, stats: Stats, interval_s: float = INTERVAL_S,
                 clock: Callable[[], float] = time.time, monotonic: Callable[[], float] = time.monotonic) -> None:
        self.path, self.stats, self.interval_s = path, stats, interval_s
        self._clock, self._monotonic = clock, monotonic
        self.pid = os.getpid()
        self.started_at = clock()
        self._start_ticks = proc.start_time("/proc", self.pid)  # the reader tells a reused pid by it
        self._next = 0.0
        self._exports = ExportHealth()
        self._rate = RequestRate()
        self._log = RateLimitedLog(log, stats, interval_s=60.0)
        self._maps: dict = {}  # kernel_io/map_memory.py summary, the last while the program was loaded
        self._maps_next = 0.0  # when to read them again (MAP_MEMORY_EVERY_S)

    def tick(self, collector) -> None:
        """Called from the collector's loop: writes when an interval has passed."""
        now = self._monotonic()
        if now < self._next:
            return
        self._next = now + self.interval_s
        self._write(lambda: self.state(collector))

    def final(self, collector) -> None:
        """The collector has stopped: its last state, marked stopped_at and kept (unless
        another collector has written the file since: that one is running)."""
        try:
            if read_state(self.path).get("pid") != self.pid:
                return
        except (OSError, ValueError):
            pass  # none yet, or not ours to keep: ours now
        self._write(lambda: {**self.state(collector), "stopped_at": self._clock()})

    def _write(self, make) -> None:
        try:
            write_atomic(self.path, make())
        except Exception as e:  # a full /run or a read-only path must not stop the collector
            self._log.event("status_write_errors", logging.WARNING, "cannot write the state file %s: %s",
                            self.path, e)

    def _kernel_maps(self, program) -> dict:
        """The program's maps' memory while it is loaded, read every MAP_MEMORY_EVERY_S (each
        map's fdinfo: an idle collector's largest cost after the scan); after, the last reading."""
        now = self._monotonic()
        if now < self._maps_next:
            return self._maps
        maps = map_memory.program_maps(program.bpf) if program is not None else []
        if maps:
            self._maps, self._maps_next = map_memory.summary(maps), now + MAP_MEMORY_EVERY_S
        return self._maps

    def state(self, collector) -> dict:
        now = self._clock()
        stats = self.stats.snapshot()
        program = collector.program
        processes = collector.traced_processes()
        destinations = collector.wiring.destinations
        return {
            "schema": SCHEMA, "version": __version__, "pid": self.pid, "pid_start_ticks": self._start_ticks,
            "started_at": self.started_at, "written_at": now, "uptime_s": round(now - self.started_at, 1),
            "interval_s": self.interval_s,
            "processes": {"count": len(processes), "listed": [
                {"pid": pid, "name": sanitize.text(proc.comm("/proc", pid) or "?"), "role": role}
                for pid, role in sorted(processes.items())[:MAX_PROCESSES]]},
            "probes": probe_status(program) if program is not None else {},
            "kernel_maps": self._kernel_maps(program),
            "requests": {"finished": stats.get("requests_finished", 0),
                         "per_second": self._rate.update(stats.get("requests_finished", 0), now)},
            "spans": destinations.spans_out,  # handed to every destination
            "attribution": dict(collector.wiring.stitcher.attributed),
            "attribution_rules": {k: v for k, v in collector.wiring.stitcher.by_rule.items() if v},
            "counters": stats,
            "exports": [self._exports.update(name, destination_counts(name, exporter, stats,
                                                                      destinations.spans_out), now)
                        for name, exporter in destinations.exporters],
        }
