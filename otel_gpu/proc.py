"""The one reader of /proc/<pid>/... . Every function takes `proc_root` (tests point it
at a fake tree). The typed readers return None when the entry is gone, unreadable or
malformed, since a process may exit between any two reads; `read`/`read_text` raise
OSError for callers that tell those cases apart."""
from __future__ import annotations

import ipaddress
import os
from dataclasses import dataclass
from typing import Iterable, Iterator, Optional

DELETED = " (deleted)"  # suffix of an exe link whose file was replaced or removed


def path(proc_root: str, pid: int, name: str = "") -> str:
    # Formatted, not os.path.join: a scan makes a few of these for every process on the node.
    return f"{proc_root}/{pid}/{name}" if name else f"{proc_root}/{pid}"


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


def _stat_field(proc_root: str, pid: int, index: int) -> Optional[int]:
    """An integer field of /proc/<pid>/stat, counted from the last ')' (comm may hold
    spaces and ')'): index 0 is field 3 (state)."""
    stat = _maybe(proc_root, pid, "stat")
    if stat is None:
        return None
    end = stat.rfind(b")")
    fields = stat[end + 1:].split() if end >= 0 else []
    try:
        return int(fields[index])
    except (IndexError, ValueError):
        return None


def start_time(proc_root: str, pid: int) -> Optional[int]:
    """Field 22 of stat: start time in clock ticks since boot; with the pid it names a
    process for good."""
    return _stat_field(proc_root, pid, 19)


def pidfd(proc_root: str, pid: int) -> Optional[int]:
    """A pidfd for the process now at `pid` (it names that process for good, as pid +
    start time do, and tells its exit without a /proc read); None when proc_root is not
    this namespace's /proc (a fake tree, another namespace's), or it cannot be opened
    (process gone, no fds left): the caller reads /proc instead."""
    if proc_root != "/proc":
        return None
    try:
        return os.pidfd_open(pid)
    except OSError:
        return None


def ppid(proc_root: str, pid: int) -> Optional[int]:
    """Field 4 of stat: the parent's pid (0 for init and kernel threads' parent)."""
    return _stat_field(proc_root, pid, 1)


def cgroup(proc_root: str, pid: int) -> Optional[list[tuple[str, str]]]:
    """(controllers, path) per line of /proc/<pid>/cgroup: ("", path) is the unified
    v2 hierarchy, the others v1 hierarchies. None when unreadable; malformed lines are
    skipped (k8s/cgroup.py is the strict parser)."""
    raw = _maybe(proc_root, pid, "cgroup")
    if raw is None:
        return None
    out = []
    for line in raw.decode(errors="replace").splitlines():
        parts = line.split(":", 2)
        if len(parts) == 3 and parts[0].isdigit() and parts[2].startswith("/"):
            out.append((parts[1], parts[2]))
    return out


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
    """Local TCP port of socket `fd`, from the process's own net namespace tables (a
    listening socket's from their short head)."""
    inode = socket_inode(proc_root, pid, fd)
    if inode is None:
        return None
    for sockets in (listening_sockets, tcp_sockets):
        for s in sockets(proc_root, pid):
            if s.inode == inode:
                return s.local_port
    return None


TCP_ESTABLISHED, TCP_LISTEN = 0x01, 0x0A


@dataclass(frozen=True)
class TcpSocket:
    """One row of /proc/<pid>/net/tcp{,6} (the process's network namespace)."""
    local_addr: str
    local_port: int
    peer_addr: str
    peer_port: int
    state: int
    inode: int


def _addr(hex_addr: str) -> str:
    """The kernel prints addresses as host-order 32-bit words in hex."""
    raw = bytes.fromhex(hex_addr)
    raw = b"".join(raw[i:i + 4][::-1] for i in range(0, len(raw), 4))
    a = ipaddress.ip_address(raw)
    return str(a.ipv4_mapped or a) if a.version == 6 else str(a)


def _row(line: str) -> Optional[TcpSocket]:
    cols = line.split()
    try:
        (la, lp), (ra, rp) = (c.rsplit(":", 1) for c in cols[1:3])
        return TcpSocket(_addr(la), int(lp, 16), _addr(ra), int(rp, 16), int(cols[3], 16), int(cols[9]))
    except (IndexError, ValueError):
        return None  # a malformed row names no socket we could use


def tcp_sockets(proc_root: str, pid: int) -> list[TcpSocket]:
    """Every row: as many as the namespace has connections (see listening_sockets)."""
    out = []
    for table in ("net/tcp", "net/tcp6"):
        text = _maybe(proc_root, pid, table)
        out += [s for s in map(_row, (text or b"").decode(errors="replace").splitlines()[1:]) if s]
    return out


def listening_sockets(proc_root: str, pid: int) -> list[TcpSocket]:
    """The LISTEN rows of the process's namespace's TCP tables. The kernel prints its
    listening hash before the established one, so the read stops at the first other row
    and costs what the listeners do, not the connections: a neighbour's 70,000 idle
    connections made one full read take seconds, every scan (bench item 18)."""
    out = []
    for table in ("net/tcp", "net/tcp6"):
        try:
            with open(path(proc_root, pid, table), "rb") as f:
                next(f, None)  # the header
                for raw in f:
                    s = _row(raw.decode(errors="replace"))
                    if s is None or s.state != TCP_LISTEN:
                        break
                    out.append(s)
        except OSError:
            continue
    return out


def sockets_held(proc_root: str, pid: int) -> Iterator[tuple[int, int]]:
    """(fd, inode) of each socket the process holds open, in descriptor order, read lazily
    (nothing once it is gone)."""
    try:
        fds = sorted(int(n) for n in os.listdir(path(proc_root, pid, "fd")) if n.isdigit())
    except OSError:
        return
    for fd in fds:
        inode = socket_inode(proc_root, pid, fd)
        if inode is not None:
            yield fd, inode


def socket_fds(proc_root: str, pid: int) -> dict[int, int]:
    """inode -> fd for every socket the process holds open."""
    return {inode: fd for fd, inode in sockets_held(proc_root, pid)}
