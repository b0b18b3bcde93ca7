"""The one reader of /proc/<pid>/... . Every function takes `proc_root` (tests point it
at a fake tree). The typed readers return None when the entry is gone, unreadable or
malformed, since a process may exit between any two reads; `read`/`read_text` raise
OSError for callers that tell those cases apart."""
from __future__ import annotations

import os
from typing import Iterable, Optional

DELETED = " (deleted)"  # suffix of an exe link whose file was replaced or removed


def path(proc_root: str, pid: int, name: str = "") -> str:
    return os.path.join(proc_root, str(pid), name) if name else os.path.join(proc_root, str(pid))


def pids(proc_root: str) -> list[int]:
    """Every process id listed now; [] when proc_root is unreadable."""
    try:
        return [int(n) for n in os.listdir(proc_root) if n.isdigit()]
    except OSError:
        return []


def read(proc_root: str, pid: int, name: str) -> bytes:
    with open(path(proc_root, pid, name), "rb") as f:
        return f.read()


def read_text(proc_root: str, pid: int, name: str) -> str:
    return read(proc_root, pid, name).decode(errors="replace")


def _maybe(proc_root: str, pid: int, name: str) -> Optional[bytes]:
    try:
        return read(proc_root, pid, name)
    except OSError:
        return None


def start_time(proc_root: str, pid: int) -> Optional[int]:
    """Field 22 of stat: start time in clock ticks since boot; with the pid it names a
    process for good. Counted from the last ')', as comm may hold spaces and ')'."""
    stat = _maybe(proc_root, pid, "stat")
    if stat is None:
        return None
    end = stat.rfind(b")")
    fields = stat[end + 1:].split() if end >= 0 else []
    try:
        return int(fields[19])  # fields[0] is field 3 (state)
    except (IndexError, ValueError):
        return None


def comm(proc_root: str, pid: int) -> Optional[str]:
    raw = _maybe(proc_root, pid, "comm")
    return None if raw is None else raw.decode(errors="replace").rstrip("\n")


def exe(proc_root: str, pid: int) -> Optional[str]:
    """The exe link's target as the kernel gives it (may end in DELETED)."""
    try:
        return os.readlink(path(proc_root, pid, "exe"))
    except OSError:
        return None


def cmdline(proc_root: str, pid: int) -> Optional[list[str]]:
    """argv; [] for kernel threads and zombies, None when unreadable."""
    raw = _maybe(proc_root, pid, "cmdline")
    return None if raw is None else [a.decode(errors="replace") for a in raw.split(b"\0") if a]


def environ(proc_root: str, pid: int, keys: Iterable[str]) -> Optional[dict[str, str]]:
    """The values of `keys` the process's initial environment sets; None when unreadable."""
    raw = _maybe(proc_root, pid, "environ")
    if raw is None:
        return None
    wanted = {k.encode() for k in keys}
    out = {}
    for item in raw.split(b"\0"):
        k, sep, v = item.partition(b"=")
        if sep and k in wanted:
            out[k.decode()] = v.decode(errors="replace")
    return out


def maps(proc_root: str, pid: int) -> Optional[str]:
    raw = _maybe(proc_root, pid, "maps")
    return None if raw is None else raw.decode(errors="replace")


def socket_inode(proc_root: str, pid: int, fd: int) -> Optional[int]:
    try:
        target = os.readlink(path(proc_root, pid, f"fd/{fd}"))
    except OSError:
        return None
    if not (target.startswith("socket:[") and target.endswith("]")):
        return None
    try:
        return int(target[8:-1])
    except ValueError:
        return None


def local_port(proc_root: str, pid: int, fd: int) -> Optional[int]:
    """Local TCP port of socket `fd`, from the process's own net namespace tables."""
    inode = socket_inode(proc_root, pid, fd)
    if inode is None:
        return None
    for table in ("net/tcp", "net/tcp6"):
        text = _maybe(proc_root, pid, table)
        for line in (text or b"").decode(errors="replace").splitlines()[1:]:
            cols = line.split()
            if len(cols) > 9 and cols[9] == str(inode):
                try:
                    return int(cols[1].rsplit(":", 1)[1], 16)
                except (IndexError, ValueError):
                    return None
    return None
