"""Go HTTP/2 handler goroutines, each tied to its stream by the server itself (records.
GoH2Unit, bpf/go_probes.c): per connection, Go's serverConn reads every frame in one
goroutine (its reader) and runs each stream's handler in a goroutine it starts for that
stream alone. So:
- a connection is served by serverConn S once S's reader reads it (the reader's record
  names S; its reads carry the reader's goroutine);
- a handler record (goroutine H, S, stream n) names the request on stream n of S's
  connection: H serves that request until it finishes (pipeline/contexts.py serves()).
Records of different CPUs arrive out of order, so a handler may come before its
connection is known or before the read that opened its stream: it waits (MAX_PENDING per
process, oldest dropped, counted). One whose stream has already come and gone is
counted too (`go_h2_handlers_late`), never bound to another request."""
from __future__ import annotations

import logging
from collections import OrderedDict
from typing import Optional

from ..ratelimit import RateLimitedLog
from ..records import GoH2Unit

MAX_PENDING = 4096   # handler goroutines waiting for their connection or stream, per process
MAX_READERS = 65536  # reader goroutines remembered per process (one per HTTP/2 connection)


class GoH2Streams:
    def __init__(self, tgid: int, ratelog: RateLimitedLog) -> None:
        self.tgid, self._log = tgid, ratelog
        self.readers: OrderedDict[int, int] = OrderedDict()  # reader goroutine -> its serverConn
        self.conns: dict[int, object] = {}  # serverConn -> the Conn it serves
        self.pending: OrderedDict[tuple, int] = OrderedDict()  # (serverConn, stream) -> handler goroutine

    def began(self, ev: GoH2Unit, conns) -> list[tuple]:
        """A reader or a handler began (`conns`: its process's connections): the
        (request, handler goroutine) pairs that can be bound now."""
        if not ev.stream:
            self.readers[ev.unit] = ev.conn
            if len(self.readers) > MAX_READERS:
                self.readers.popitem(last=False)
            # a reader whose reads came first (records of other CPUs)
            return [b for c in [c for c in conns if c.read_by == ev.unit] for b in self.read(ev.unit, c)]
        c = self.conns.get(ev.conn)
        if c is None:
            self._wait(ev.conn, ev.stream, ev.unit)
            return []
        return self._place(c, ev.unit, ev.stream)

    def read(self, unit: int, c) -> list[tuple]:
        """Goroutine `unit` read multiplexed connection `c`: if it is a reader, `c` is its
        serverConn's, and the handlers that waited for that connection are placed: the
        (request, handler goroutine) pairs that can be bound now."""
        server = self.readers.get(unit)
        if server is None or self.conns.get(server) is c:
            return []
        old = self.conns.get(server)
        if old is not None:  # a serverConn address serving another connection: the old one is gone
            old.go_h2_server = None
        self.conns[server] = c
        c.go_h2_server = server
        waiting = [(self.pending.pop(k), k[1]) for k in [k for k in self.pending if k[0] == server]]
        return [b for handler, stream in waiting for b in self._place(c, handler, stream)]

    def handler(self, c, stream: int) -> Optional[int]:
        """The handler goroutine waiting for stream `stream` of connection `c`, if any."""
        return self.pending.pop((c.go_h2_server, stream), None) if c.go_h2_server is not None else None

    def _place(self, c, handler: int, stream: int) -> list[tuple]:
        """Handler goroutine `handler` serves stream `stream` of `c`: [(its request,
        handler)], or it waits for the request to open, or it is late (its stream has
        come and gone): []."""
        req = c.streams.get(stream)
        if req is not None:
            return [(req, handler)]
        if stream > c.last_stream:
            self._wait(c.go_h2_server, stream, handler)
        else:
            self._log.event("go_h2_handlers_late", logging.INFO,
                            "pid %d: a Go HTTP/2 handler goroutine's stream had finished before its record came: "
                            "not bound", self.tgid)
        return []

    def _wait(self, server: int, stream: int, unit: int) -> None:
        self.pending[(server, stream)] = unit
        if len(self.pending) > MAX_PENDING:
            self.pending.popitem(last=False)
            self._log.event("go_h2_handlers_dropped", logging.WARNING,
                            "pid %d: %d Go HTTP/2 handler goroutines wait for their stream; the oldest is "
                            "dropped (its calls stay unbound: ambiguous)", self.tgid, MAX_PENDING)

    def closed(self, c) -> None:
        """`c` is gone: its serverConn serves nothing any more (its address may be reused)."""
        server = c.go_h2_server
        if server is not None and self.conns.get(server) is c:
            del self.conns[server]
            for k in [k for k in self.pending if k[0] == server]:
                del self.pending[k]
