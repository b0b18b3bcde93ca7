"""Counters plus log lines that cannot flood: one line per kind of problem per interval.

A collector that sees a bad /proc entry sees it for every span of that process; the
count goes up every time, the log line says it once and how many were folded in.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable, Dict


# Counters of work done or facts seen, not of something lost, refused or folded: the
# `stopped:` line, `otel-gpu status` and the otel_gpu.drops metric list them apart.
NOT_DROPS = frozenset({"requests_finished", "spans_exported", "resolved", "relists", "watch_events",
                       "tls_connections", "probe_attach_retried", "traces_unsampled", "cuda_calls_streamed",
                       "cuda_calls_counted", "requests_summarised", "heads_sampled_in_kernel",
                       "heads_sampled_here", "cuda_calls_streamed_unsampled",
                       # records the collector read: from the ring buffer, and per-request counts (req_agg)
                       "ring_records", "aggregate_records",
                       # the collector's own export connections, left alone on purpose (own_sockets.py), and
                       # the requests open on one found to be ours after its accept (ended, no span)
                       "connections_own_export", "requests_own_export",
                       # device-clock mode: records tied to their calls (pipeline/device_times.py)
                       "device_tied",
                       # a runtime launch's pass through the driver, counted once: at the runtime's
                       # probe, or at the driver's where the runtime's is detached (bpf/launch_routes.c)
                       "driver_launches_deduped", "driver_launches_as_runtime",
                       # a close read after the accept that took its socket's number (it had ended it)
                       "connection_closes_after_reuse"})


def split_drops(counts: Dict[str, int]) -> tuple[Dict[str, int], Dict[str, int]]:
    """(drops, the rest), each by name."""
    drops = {k: v for k, v in sorted(counts.items()) if k not in NOT_DROPS}
    return drops, {k: v for k, v in sorted(counts.items()) if k in NOT_DROPS}


class Stats:
    """Thread-safe named counters; `snapshot()` is what callers expose as `stats`."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._counts: Dict[str, int] = {}

    def add(self, name: str, amount: int = 1) -> None:
        with self._lock:
            self._counts[name] = self._counts.get(name, 0) + amount

    def snapshot(self) -> Dict[str, int]:
        with self._lock:
            return dict(self._counts)


class RateLimitedLog:
    """Logs each key at most once per `interval_s`, counting every occurrence in `stats`."""

    def __init__(
        self,
        logger: logging.Logger,
        stats: Stats,
        interval_s: float = 60.0,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self._logger = logger
        self._stats = stats
        self._interval_s = interval_s
        self._clock = clock
        self._lock = threading.Lock()
        self._last: Dict[str, float] = {}
        self._suppressed: Dict[str, int] = {}

    def event(self, key: str, level: int, message: str, *args: object, count: int = 1) -> None:
        """Counts `count` under `key` and logs `message % args` unless `key` was logged recently."""
        self._stats.add(key, count)
        now = self._clock()
        with self._lock:
            last = self._last.get(key)
            if last is not None and now - last < self._interval_s:
                self._suppressed[key] = self._suppressed.get(key, 0) + 1
                return
            self._last[key] = now
            folded = self._suppressed.pop(key, 0)
        if folded:
            message += " (%d more like this since the last report)"
            args = args + (folded,)
        self._logger.log(level, message, *args)
