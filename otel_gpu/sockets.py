"""Sockets of traced processes, from /proc: server.port of a request (the local port of
the listening, else the accepted, socket), and the server connections a process held
before we traced it."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from .proc import (TCP_ESTABLISHED, TCP_LISTEN, listening_sockets, local_port, socket_fds, socket_inode, sockets_held,
                   tcp_sockets)


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

    def peer(self, pid: int, fd: int) -> Optional[tuple[str, int]]:
        """The remote end of an accepted connection, for accepts that did not ask for it."""
        inode = socket_inode(self.proc_root, pid, fd)
        for s in tcp_sockets(self.proc_root, pid) if inode is not None else ():
            if s.inode == inode:
                return s.peer_addr, s.peer_port
        return None

    def forget(self, pid: int) -> None:
        for key in [k for k in self._ports if k[0] == pid]:
            del self._ports[key]


def open_sockets(proc_root: str, pid: int) -> dict[int, int]:
    """fd -> socket inode for every socket the process holds ({} once it is gone): what
    says a connection closed when its close was never seen."""
    return {fd: inode for inode, fd in socket_fds(proc_root, pid).items()}


def listens(proc_root: str, pid: int) -> bool:
    """Does the process hold a listening TCP socket (may it serve HTTP)? Its descriptors
    are read until one is a listener: a server's comes early, before its connections."""
    listening = {s.inode for s in listening_sockets(proc_root, pid)}
    return bool(listening) and any(inode in listening for _, inode in sockets_held(proc_root, pid))


@dataclass(frozen=True)
class ServerConnection:
    """An accepted connection a process already held when we started tracing it."""
    fd: int
    listen_fd: int   # the listening socket on the same local port, -1 if not held
    peer_addr: str
    peer_port: int
    inode: int       # its socket's (socket:[N]): the kernel's close check (bpf/maps.h fd_ino)


def existing_server_connections(proc_root: str, pid: int) -> list[ServerConnection]:
    """Established TCP connections on a port the process itself listens on: the server
    side of keep-alive connections opened before the collector (their accept was never
    seen). Client connections of the process (to a database, say) are left out."""
    fds = socket_fds(proc_root, pid)
    sockets = [s for s in tcp_sockets(proc_root, pid) if s.inode in fds]
    listening = {(s.local_addr, s.local_port): fds[s.inode] for s in sockets if s.state == TCP_LISTEN}
    out = []
    for s in sockets:
        if s.state != TCP_ESTABLISHED:
            continue
        listen_fd = listening.get((s.local_addr, s.local_port))
        for wildcard in ("0.0.0.0", "::"):
            listen_fd = listen_fd if listen_fd is not None else listening.get((wildcard, s.local_port))
        if listen_fd is not None:
            out.append(ServerConnection(fds[s.inode], listen_fd, s.peer_addr, s.peer_port, s.inode))
    return out
