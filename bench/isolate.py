"""Starts a bench target in a cgroup of its own, as a container would be.

The collector relates processes by cgroup, or, where a cgroup does not tell, by
parent/child (otel_gpu/pipeline/groups.py), and traces a related process that listens
on TCP as an HTTP server. A target in the bench's own cgroup (or its child) makes the
bench process, which holds the OTLP receiver (a gRPC server), such a related server:
its export connections parse as gRPC spans and can make the target's calls `shared`
or ambiguous. In a cgroup of its own the target is related to nothing, so the bench
measures the service alone."""
from __future__ import annotations

import itertools
import logging
import os
import time
from pathlib import Path

log = logging.getLogger(__name__)

# The unified (v2) hierarchy: hybrid hosts mount it under unified/, v2-only hosts at the top.
_ROOTS = (Path("/sys/fs/cgroup/unified"), Path("/sys/fs/cgroup"))
_names = itertools.count()


def _root() -> Path | None:
    return next((r for r in _ROOTS if (r / "cgroup.procs").exists()), None)


def _sweep(root: Path) -> None:
    """Empty cgroups of earlier bench runs whose process is gone (killed before remove())."""
    for d in root.glob("otel-gpu-bench-*-*"):
        pid = d.name.split("-")[3]
        if pid.isdigit() and not Path("/proc", pid).exists():
            try:
                d.rmdir()
            except OSError:
                pass  # a process still in it: left for its owner


_swept = False


class OwnCgroup:
    """One cgroup for one target: wrap(argv) makes the target move itself into it before
    it execs (same pid); remove() once the target is gone."""

    def __init__(self) -> None:
        global _swept
        root = _root()
        if root is not None and not _swept:
            _swept = True
            _sweep(root)
        self.path = None if root is None else root / f"otel-gpu-bench-{os.getpid()}-{next(_names)}"
        if self.path is not None:
            try:
                self.path.mkdir()
            except OSError as e:
                log.warning("bench: no cgroup of its own for a target (%s): the bench process may be "
                            "traced as a related server", e)
                self.path = None

    def wrap(self, argv: list) -> list:
        if self.path is None:
            return list(argv)
        join = 'echo $$ > "$0" || echo "bench: target not in a cgroup of its own" >&2; exec "$@"'
        return ["sh", "-c", join, str(self.path / "cgroup.procs"), *map(str, argv)]

    def remove(self, wait_s: float = 5.0) -> None:
        """Once the target has exited; its children (a worker) may take a moment more."""
        if self.path is None:
            return
        deadline = time.monotonic() + wait_s
        while True:
            try:
                self.path.rmdir()
                break
            except OSError as e:
                if time.monotonic() > deadline:
                    log.warning("bench: cgroup %s left behind: %s", self.path, e)
                    break
                time.sleep(0.1)
        self.path = None
