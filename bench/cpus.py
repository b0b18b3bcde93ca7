"""Where a measured process runs: the service on a CPU of its own, its load generator and
the collector on the others, so that what the service's CPU per request shows is what the
probes add on its threads, not what sharing a core with the collector does to it (on 2
cores, item 9's cleartext figure read 68 µs traced against 80 untraced: cheaper with the
probes on, docs/performance.md note 44)."""
from __future__ import annotations

import os
from pathlib import Path


def split() -> tuple[set[int], set[int]] | None:
    """(the service's CPU, every other CPU this process may use), or None with fewer than 2."""
    cpus = sorted(os.sched_getaffinity(0))
    return ({cpus[0]}, set(cpus[1:])) if len(cpus) > 1 else None


def pin(pid: int, cpus: set[int]) -> None:
    """Every thread of `pid` to `cpus`; threads it makes later inherit it from theirs."""
    for task in Path(f"/proc/{pid}/task").iterdir():
        try:
            os.sched_setaffinity(int(task.name), cpus)
        except (ProcessLookupError, FileNotFoundError):
            pass  # that thread ended meanwhile


def on(cpus: set[int] | None):
    """A subprocess preexec_fn that starts the child on `cpus` (None: where it would run)."""
    if cpus is None:
        return None
    return lambda: os.sched_setaffinity(0, cpus)
