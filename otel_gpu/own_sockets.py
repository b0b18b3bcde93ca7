"""The collector's own TCP connections, so that its export traffic is never traced. A
receiver in a process the collector traces (an OTel Collector sidecar in a GPU pod, a
related server) accepts the collector's OTLP connection like any other: followed, each
export RPC would become a server span, exported in turn. An accepted connection is the
collector's own when its peer is one of these sockets' local ends and its server port is
that socket's remote port (pipeline/proc_facts.py marks its Accept).

The local end alone does not say it: Linux gives one local port to connections to
different destinations at once (measured here: a loopback port of ours was handed to
4 of 40,000 connections to another server while ours stayed open). A client of the
traced server whose port ours also uses was taken for ours, and its requests were never
seen. A Service that maps the receiver's port to another target port (DNAT) makes the
remote port differ too: the collector's export to it is then traced like a client's,
visible as its spans, never a client silently lost.

The sockets are read with getsockname()/getpeername() on this process's descriptors (a
few dozen) for a peer that could be ours (a loopback address, or one our sockets use),
at most once every REFRESH_NS, and again before an answer from a read older than that: a
flood of local connections costs at most that rate of re-reads. Peers elsewhere are never
ours and cost one set lookup. A miss within that time is not sure (our socket may be
newer than the read): pipeline/proc_facts.py asks again at its next Tick, after
refresh()."""
from __future__ import annotations

import ipaddress
import os
import socket
import time
from typing import Callable, Optional

REFRESH_NS = 50_000_000  # the least time between two re-reads of the descriptors


def _connections(fd_dir: str = "/proc/self/fd") -> dict:
    """(address, port) of the local end of every connected TCP socket of this process ->
    the remote ports it is connected to (IPv4-mapped IPv6 addresses as IPv4)."""
    ends: dict = {}
    try:
        fds = os.listdir(fd_dir)
    except OSError:
        return ends
    for name in fds:
        try:
            if not os.readlink(f"{fd_dir}/{name}").startswith("socket:"):
                continue
            s = socket.socket(fileno=os.dup(int(name)))
        except (OSError, ValueError):
            continue
        try:
            if s.type == socket.SOCK_STREAM and s.family in (socket.AF_INET, socket.AF_INET6):
                remote_port = s.getpeername()[1]  # OSError for a listener: never a connection's peer
                addr, port = s.getsockname()[:2]
                ends.setdefault((_plain(addr), port), set()).add(remote_port)
        except OSError:
            pass
        finally:
            s.close()  # the duplicate only
    return ends


def _plain(addr: str) -> str:
    try:
        a = ipaddress.ip_address(addr)
    except ValueError:
        return addr
    mapped = getattr(a, "ipv4_mapped", None)
    return str(mapped or a)


class OwnSockets:
    def __init__(self, read: Callable[[], dict] = _connections, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._read, self._clock = read, clock
        self._ends: dict = {}  # as _connections() returns it
        self._addrs: set = set()
        self._read_at: Optional[int] = None

    def owns(self, addr: Optional[str], port: Optional[int], server_port: Optional[int]) -> Optional[bool]:
        """Whether the accepted connection from (addr, port) to `server_port` is one of
        our sockets; None: not by a read made before it may have been (ask again after
        refresh()). server_port None (its socket could not be read): the local end alone
        decides."""
        if addr is None or port is None:
            return False
        addr = _plain(addr)
        if addr not in self._addrs and not _loopback(addr):
            return False  # not an address of this host's sockets: never ours
        now = self._clock()
        fresh = self._read_at is None or now - self._read_at >= REFRESH_NS
        if fresh:
            self._reread(now)
        remotes = self._ends.get((addr, port))
        if remotes and (server_port is None or server_port in remotes):
            return True
        return False if fresh else None

    def refresh(self) -> None:
        """Reads the sockets now, whatever the time since the last read."""
        self._reread(self._clock())

    def _reread(self, now: int) -> None:
        self._read_at = now
        self._ends = self._read()
        self._addrs = {a for a, _ in self._ends}


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False
