"""The /proc facts the stitcher needs, as records, so that it reads nothing itself: the
stage just before it. For each server connection: the listening socket's port and, when
the accept named none (uvloop's accept(fd, NULL, NULL)), the peer, and whether that peer
is the collector itself (its export connection: own_sockets.py), on its Accept record;
where that was not sure (our socket newer than the last read of them), asked again at the
next Tick, and the Accept sent again marked `own` if it is (the stitcher ignores the
connection from then on); a connection first seen in a read (accepted before tracing,
not seeded) gets an Accept made for it. For each process: its group of related
processes (ProcessGroup) before its first record. At Ticks: the sockets each process
with connections still holds (OpenSockets), for the audit of closes never seen: processes
with untracked connections at every Tick (their I/O is not seen), every one each
AUDIT_ALL_NS (a close lost with a full ring buffer)."""
from __future__ import annotations

from dataclasses import replace
from typing import Callable, Optional

from ..records import (EV_SOCK_READ, Accept, OpenSockets, ProcessGone, ProcessGroup, ProcExit, SockClose, SockIo,
                       Tick)

AUDIT_ALL_NS = 60 * 10**9  # how often every connection is checked against /proc
MAX_UNSURE = 1024  # accepts whose own check waits for the next Tick; past it, taken as not ours
_CONNECTION_RECORDS = frozenset((Accept, SockIo, SockClose, ProcExit, ProcessGone))


class ProcFacts:
    def __init__(self, port_of: Callable[[int, int, int], Optional[int]],
                 peer_of: Callable[[int, int], Optional[tuple]],
                 group_of: Callable[[int], Optional[str]],
                 sockets_of: Callable[[int], dict],
                 own=None) -> None:
        """port_of(pid, listen_fd, conn_fd), peer_of(pid, fd), group_of(pid) and
        sockets_of(pid): the /proc readers (sockets.py, pipeline/groups.py); own: an
        own_sockets.OwnSockets, whether a connection from a peer to a port is the
        collector's own (None: never)."""
        self._port_of, self._peer_of, self._group_of, self._sockets_of = port_of, peer_of, group_of, sockets_of
        self._own = own
        self._unsure: dict[tuple[int, int], Accept] = {}  # (tgid, fd) -> its Accept, asked again at the next Tick
        self._grouped: set[int] = set()
        self._conns: dict[int, dict[int, bool]] = {}  # tgid -> {fd: tracked}
        self._next_audit_ns = 0

    def process(self, batch: list) -> list:
        out: list = []
        grouped = self._grouped
        for ev in batch:  # every record of the ring passes here: the common case is one test
            cls = ev.__class__
            if cls is Tick:
                self._ask_again(out)
                self._audit(ev.now_ns, out)
                out.append(ev)
                continue
            tgid = getattr(ev, "tgid", None)
            if tgid not in grouped and tgid is not None and cls is not ProcessGone and cls is not ProcExit:
                grouped.add(tgid)
                out.append(ProcessGroup(tgid, self._group_of(tgid)))
            if cls not in _CONNECTION_RECORDS:
                out.append(ev)
                continue
            if cls is Accept:
                self._accepted(ev)
            elif cls is SockIo and ev.kind == EV_SOCK_READ and ev.fd not in self._conns.get(tgid, ()):
                out.append(Accept(tgid, ev.tid, ev.ts_ns, ev.fd, -1, None, None,
                                  server_port=self._port_of(tgid, -1, ev.fd)))  # peer unknown
                self._conns.setdefault(tgid, {})[ev.fd] = True
            elif cls is SockClose:
                self._conns.get(tgid, {}).pop(ev.fd, None)
                self._unsure.pop((tgid, ev.fd), None)
            elif cls is ProcExit or cls is ProcessGone:
                self._conns.pop(tgid, None)
                self._grouped.discard(tgid)
                if self._unsure:
                    self._unsure = {k: a for k, a in self._unsure.items() if k[0] != tgid}
            out.append(ev)
        return out

    def _accepted(self, ev: Accept) -> None:
        self._conns.setdefault(ev.tgid, {})[ev.fd] = ev.tracked
        self._unsure.pop((ev.tgid, ev.fd), None)  # a connection before it on this fd
        if not ev.tracked:
            return
        if ev.peer_addr is None:
            ev.peer_addr, ev.peer_port = self._peer_of(ev.tgid, ev.fd) or (None, None)
        ev.server_port = self._port_of(ev.tgid, ev.listen_fd, ev.fd)
        own = self._own is not None and self._own.owns(ev.peer_addr, ev.peer_port, ev.server_port)
        ev.own = own is True
        if own is None and len(self._unsure) < MAX_UNSURE:
            self._unsure[(ev.tgid, ev.fd)] = ev

    def _ask_again(self, out: list) -> None:
        """The accepts whose own check was not sure, with the collector's sockets read now:
        those that are ours are sent again, marked."""
        if not self._unsure:
            return
        self._own.refresh()
        for ev in self._unsure.values():  # a miss reads None now too (the read is that recent): not ours
            if self._own.owns(ev.peer_addr, ev.peer_port, ev.server_port) is True:
                out.append(replace(ev, own=True, again=True))
        self._unsure.clear()

    def _audit(self, now_ns: int, out: list) -> None:
        everyone = now_ns >= self._next_audit_ns
        if everyone:
            self._next_audit_ns = now_ns + AUDIT_ALL_NS
        for tgid, conns in list(self._conns.items()):
            if not conns or not (everyone or not all(conns.values())):
                continue
            fds = self._sockets_of(tgid)
            for fd in [fd for fd, tracked in conns.items() if not tracked and fd not in fds]:
                del conns[fd]  # an untracked one's close is never seen: gone, as the stitcher finds
            out.append(OpenSockets(tgid, fds, everyone, now_ns))
