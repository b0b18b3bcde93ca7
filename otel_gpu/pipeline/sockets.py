"""server.port of a request: the local TCP port of the listening (else the accepted)
socket, read from /proc once per listening socket."""
from __future__ import annotations

from typing import Optional

from ..proc import local_port


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
