"""Local TCP port of a process's socket fd, from /proc (server.port)."""
from __future__ import annotations

import os
from typing import Optional


def socket_inode(proc_root: str, pid: int, fd: int) -> Optional[int]:
    try:
        target = os.readlink(f"{proc_root}/{pid}/fd/{fd}")
    except OSError:
        return None
    if not target.startswith("socket:["):
        return None
    return int(target[8:-1])


def local_port(proc_root: str, pid: int, fd: int) -> Optional[int]:
    inode = socket_inode(proc_root, pid, fd)
    if inode is None:
        return None
    for table in ("tcp", "tcp6"):
        try:
            with open(f"{proc_root}/{pid}/net/{table}") as f:
                next(f, None)
                for line in f:
                    cols = line.split()
                    if len(cols) > 9 and cols[9] == str(inode):
                        return int(cols[1].rsplit(":", 1)[1], 16)
        except OSError:
            continue
    return None


class PortCache:
    """server.port per (pid, listening fd); listening sockets live long, so a cache holds."""

    def __init__(self, proc_root: str = "/proc") -> None:
        self.proc_root = proc_root
        self._ports: dict[tuple[int, int], Optional[int]] = {}

    def port(self, pid: int, listen_fd: int, conn_fd: int) -> Optional[int]:
        key = (pid, listen_fd)
        if listen_fd >= 0 and key in self._ports:
            return self._ports[key]
        port = local_port(self.proc_root, pid, listen_fd) if listen_fd >= 0 else None
        if port is None:
            port = local_port(self.proc_root, pid, conn_fd)
        if listen_fd >= 0 and port is not None:
            self._ports[key] = port
        return port

    def forget(self, pid: int) -> None:
        for key in [k for k in self._ports if k[0] == pid]:
            del self._ports[key]
