"""The collector's own TCP connections, so that its export traffic is never traced. A
receiver in a process the collector traces (an OTel Collector sidecar in a GPU pod, a
related server) accepts the collector's OTLP connection like any other: followed, each
export RPC would become a server span, exported in turn. An accepted connection whose
peer is one of these sockets' local ends is the collector's own, and is left alone
(pipeline/proc_facts.py marks its Accept).

The local ends are read with getsockname() on this process's socket descriptors (a few
dozen), again on a miss for a peer that could be ours (a loopback address, or one our
sockets use), at most once every REFRESH_NS: a flood of local connections costs at most
that rate of re-reads. Peers elsewhere are never ours and cost one set lookup."""
from __future__ import annotations

import ipaddress
import os
import socket
import time
from typing import Callable, Optional

REFRESH_NS = 50_000_000  # the least time between two re-reads of the descriptors


def _local_ends(fd_dir: str = "/proc/self/fd") -> set:
    """(address, port) of every TCP socket of this process, IPv4-mapped IPv6 as IPv4."""
    ends = set()
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
                addr, port = s.getsockname()[:2]
                ends.add((_plain(addr), port))
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
    def __init__(self, read: Callable[[], set] = _local_ends, clock: Callable[[], int] = time.monotonic_ns) -> None:
        self._read, self._clock = read, clock
        self._ends: set = set()
        self._addrs: set = set()
        self._read_at: Optional[int] = None

    def owns(self, addr: Optional[str], port: Optional[int]) -> bool:
        """Whether (addr, port), an accepted connection's peer, is one of our sockets."""
        if addr is None or port is None:
            return False
        addr = _plain(addr)
        if (addr, port) in self._ends:
            return True
        if addr not in self._addrs and not _loopback(addr):
            return False  # not an address of this host's sockets: never ours
        now = self._clock()
        if self._read_at is not None and now - self._read_at < REFRESH_NS:
            return False
        self._read_at = now
        self._ends = self._read()
        self._addrs = {a for a, _ in self._ends}
        return (addr, port) in self._ends


def _loopback(addr: str) -> bool:
    try:
        return ipaddress.ip_address(addr).is_loopback
    except ValueError:
        return False
