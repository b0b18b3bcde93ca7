"""Which traced processes are related, so GPU work one does while another holds the
requests can be tied to them (model.SHARED): a front-end and its GPU worker, vLLM's
API server and engine core, SGLang's HTTP server and scheduler, Triton and its Python
backend stubs.

A process's group key is
  - its cgroup ("cgroup:<path>"): the unified v2 path, or the v1 paths joined when
    the v2 one is the root (hybrid hosts), provided the cgroup names a unit of its own
    (a container, a pod's container, a systemd service) and not the root, init.scope,
    or a systemd user/session slice that unrelated processes share;
  - else its process tree ("tree:<pid>"): the pid of its oldest ancestor in an
    unbroken chain of traced parents (a traced process and its traced children, and
    theirs, share the key of the topmost one).
Keys are cached per pid until the process is forgotten (ProcessGone); tree keys are
recomputed when the set of traced processes changes. /proc reads are in proc.py."""
from __future__ import annotations

import re
from typing import Iterable, Optional

from .. import proc

# Slices/scopes that hold whatever a user or a login session starts.
_SESSION = re.compile(r"^(user\.slice|user-\d+\.slice|user@\d+\.service|session-[^/]*\.scope|init\.scope)$")
MAX_DEPTH = 16  # ancestors walked for a tree key


def cgroup_key(lines: Optional[list[tuple[str, str]]]) -> Optional[str]:
    """The group key of proc.cgroup() lines, or None when the cgroup is not one a
    process can be known to share only with its relatives."""
    if not lines:
        return None
    unified = [path for controllers, path in lines if controllers == ""]
    v1 = sorted((c, path) for c, path in lines if c != "")
    if unified and unified[0] != "/":
        paths, key = unified[:1], unified[0]
    else:
        paths = [path for _, path in v1 if path != "/"]
        key = ";".join(f"{c}:{path}" for c, path in v1)
    if not paths or any(_session(path) for path in paths):
        return None
    return "cgroup:" + key


def _session(path: str) -> bool:
    return any(_SESSION.match(part) for part in path.split("/") if part)


class ProcessGroups:
    """pid -> group key, for the stitcher (a callable) and discovery. `traced` is the
    set of traced processes (the collector sets it after each scan)."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._cgroups: dict[int, Optional[str]] = {}  # pid -> cgroup key or None
        self._keys: dict[int, str] = {}
        self.traced: frozenset = frozenset()

    def __call__(self, pid: int) -> Optional[str]:
        return self.key(pid)

    def key(self, pid: int) -> Optional[str]:
        k = self._keys.get(pid)
        if k is None:
            k = self._keys[pid] = self.cgroup(pid) or f"tree:{self._root(pid)}"
        return k

    def cgroup(self, pid: int) -> Optional[str]:
        """The process's cgroup key (None: its cgroup does not tell), cached."""
        if pid not in self._cgroups:
            self._cgroups[pid] = cgroup_key(proc.cgroup(self.proc_root, pid))
        return self._cgroups[pid]

    def _root(self, pid: int) -> int:
        root, seen = pid, {pid}
        for _ in range(MAX_DEPTH):
            parent = proc.ppid(self.proc_root, root)
            if not parent or parent in seen or parent not in self.traced:
                break
            root = parent
            seen.add(parent)
        return root

    def relatives(self, pids: Iterable[int], anchors: set) -> set:
        """The processes among `pids` that would share a group key with one of `anchors`
        once traced: the same cgroup key, or, where neither has one, a parent or a
        child (discovery traces them; key() then agrees)."""
        anchor_cgroups = {self.cgroup(a) for a in anchors} - {None}
        tree = {a for a in anchors if self.cgroup(a) is None}
        parents = {proc.ppid(self.proc_root, a) for a in tree} - {None, 0}
        out = set()
        for pid in pids:
            if pid in anchors:
                continue
            cg = self.cgroup(pid)
            if cg is not None:
                if cg in anchor_cgroups:
                    out.add(pid)
            elif tree and (pid in parents or proc.ppid(self.proc_root, pid) in tree):
                out.add(pid)
        return out

    def set_traced(self, pids: Iterable[int]) -> None:
        """The traced set changed: tree keys may have (a parent became traced)."""
        pids = frozenset(pids)
        if pids != self.traced:
            self.traced = pids
            self._keys = {p: k for p, k in self._keys.items() if not k.startswith("tree:")}

    def forget(self, pids: Iterable[int]) -> None:
        for pid in pids:
            self._cgroups.pop(pid, None)
            self._keys.pop(pid, None)

    def retain(self, pids: Iterable[int]) -> None:
        """Only these processes still exist (a discovery scan's listing)."""
        alive = set(pids)
        for table in (self._cgroups, self._keys):
            for pid in [p for p in table if p not in alive]:
                del table[pid]

    def state(self) -> dict:
        return {"groups_cached": len(self._cgroups)}
