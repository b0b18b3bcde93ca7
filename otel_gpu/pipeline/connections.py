"""The HTTP half of pipeline/stitcher.Stitcher: each server connection of a traced
process, its reads and writes through the protocol session its first bytes chose
(protocols.detect), and the requests they open and finish. A request opens when its head
is read (or, pipelined, when the response before it completes) and finishes when its
response has been written completely or the connection goes away. Response writes bind
requests to the Python contexts that serve them (pipeline/contexts.py,
pipeline/handlers.py). Nothing here knows a protocol's bytes: the sessions
(protocols/<name>/) turn them into request events.

Connections reads and writes the StitchState it shares with the CUDA half
(pipeline/process_state.py: Proc, Conn), tells that half (pipeline/attribution.py
CallAttribution) when requests open and finish and hands it the held calls a binding
settles, and keeps the sampling state the collector reads (quiet, kernel_bound,
unsampled_parent_seen). The /proc facts it needs come on the records
(pipeline/proc_facts.py)."""
from __future__ import annotations

import logging
from typing import Optional

from opentelemetry.trace import SpanKind

from ..kernel_io.abi import GO_UNIT
from ..records import EV_SOCK_READ, Accept, GoH2Unit, RequestOpened, SockClose, SockIo
from . import protocols, sampling
from .attribution import CallAttribution
from .model import CallSink, Request
from .process_state import Conn, Proc, StitchState
from .protocols.base import (DETECT_MAX, Notice, ProtocolError, RequestFinished, RequestStarted, ResponseStatus,
                             SessionConfig, StreamReset, SwitchProtocol)
from .responses import note_response, responding_stream
from .traceparent import parse_traceparent, traceparent_sampled


class Connections:
    """Socket records -> requests."""

    def __init__(self, state: StitchState, calls: CallAttribution, extra_headers: frozenset, rng,
                 sampler=None, kernel_bound: Optional[int] = None, root_bound: Optional[int] = None) -> None:
        self.s, self.calls = state, calls
        self.stats, self._log = state.stats, state.log
        self._session_config = SessionConfig(extra_headers)
        self._rng = rng
        self._sampler = sampler  # pipeline/sampling.py; None: every trace sampled
        self.kernel_bound = kernel_bound  # sampling.kernel_bound(): the kernel's draws decide roots against it
        self.root_bound = root_bound  # sampling.root_bound(): the sampler's decision for roots; None: ask it
        # An incoming traceparent said "not sampled": the collector may have the kernel decide
        # parents from now on (sampling.bound_once_parents_unsampled).
        self.unsampled_parent_seen = False
        self.quiet: dict[int, bool] = {}  # tgid -> whether all its open requests are unsampled, as changed

    def on_accept(self, ev: Accept, out: list) -> None:
        p = self.s.proc(ev.tgid, out)
        old = p.conns.get(ev.fd)
        if ev.again:  # found ours after its accept (proc_facts.py), if that connection is still here
            if old is not None and not old.own and old.is_socket(ev.inode, (ev.peer_addr, ev.peer_port)):
                self._found_own(p, old, ev.ts_ns)
            return
        if old is not None and old.tracked and ev.inode is not None and old.inode == ev.inode:
            # The same socket, followed already: a seed that read /proc while the kernel's
            # records of the connection were on their way (or seeded it again).
            return
        if old is not None:  # the old connection's close was not seen
            self.drop_conn(p, old, ev.ts_ns, "connection replaced", out)
        if ev.own:  # the collector's own export: a span for it would be exported in turn
            p.conns[ev.fd] = Conn(ev.fd, own=True)
            self.stats.add("connections_own_export")
            return
        if not ev.tracked:  # counted by the kernel (connections_untracked); released by the audit
            p.conns[ev.fd] = Conn(ev.fd, tracked=False)
            p.untracked += 1
            return
        c = p.conns[ev.fd] = Conn(ev.fd, ev.peer_addr, ev.peer_port, ev.listen_fd)
        c.server_port, c.inode = ev.server_port, ev.inode

    def _found_own(self, p: Proc, c: Conn, ts: int) -> None:
        """A connection found to be the collector's own after its accept: ignored from now
        on, the requests open on it ended with no span (its export RPCs)."""
        c.own = True
        self.stats.add("connections_own_export")
        for req in list(c.streams.values()):
            self._end(p, c, req, ts, "the collector's own export")
            self.stats.add("requests_own_export")

    def on_read(self, ev: SockIo, out: list) -> None:
        p = self.s.proc(ev.tgid, out)
        c = self.s.conn(p, ev.fd)
        if c.own:
            return
        p.times.seen(ev)
        p.threads.io(ev.tid, ev.fd, c.streams.values())
        c.tls = c.tls or ev.tls
        if ev.req_start:  # the kernel's next request on the connection: its draw, if any
            c.draw, c.draw_taken = ev.draw, False
        if ev.ctx:
            p.contexts.seen(ev.tid, ev.ctx, ev.ts_ns)
        if (ev.lost or c.resync) and not c.broken and self._resync(p, c, ev, out):
            return
        if c.broken:
            p.broken.setdefault(ev.tid, set()).add(ev.fd)
            return
        if ev.digest is not None and not self._takes_digest(p, c, ev, out):
            return
        if c.session is not None:
            reads = ((ev.digest or ev.data, ev.ret, ev.ts_ns, ev.tid, ev.ctx),)
        elif (reads := self._detect(p, c, ev)) is None:
            return
        for data, length, ts, tid, unit in reads:
            self._apply(p, c, c.session.on_read(data, length, ts, tid), tid, ts, out, unit)
            if c.broken:
                return
        if ev.ctx & GO_UNIT and not c.session.serial:
            c.read_by = ev.ctx
            if p.go_h2.readers:
                self._serve(p, p.go_h2.read(ev.ctx, c), ev.tid, ev.ts_ns)
        if c.session.partial:
            p.partial_heads[ev.tid] = ev.fd
        elif p.partial_heads.get(ev.tid) == ev.fd:
            del p.partial_heads[ev.tid]

    def _detect(self, p: Proc, c: Conn, ev: SockIo) -> Optional[tuple]:
        """The connection's reads so far once its first bytes tell its protocol (c.session
        is then set); None while they cannot yet, or when no protocol claims them (counted,
        logged, the connection ignored until it closes)."""
        if ev.ret <= 0 and not ev.data:
            return None  # nothing read: nothing to tell
        c.prefix = (c.prefix + ev.data)[:DETECT_MAX]
        c.early.append((ev.digest or ev.data, ev.ret, ev.ts_ns, ev.tid, ev.ctx))
        proto = protocols.detect(c.prefix)
        if proto is protocols.PENDING:
            if ev.ret <= len(ev.data) or (ev.digest is not None and ev.digest.more):
                p.partial_heads[ev.tid] = ev.fd  # a head may be on its way
                return None
            proto = None  # the rest of this read was not copied: no more bytes to tell by
        reads, prefix, c.prefix, c.early = c.early, c.prefix, b"", []
        if proto is None:
            self._log.event("connections_unknown_protocol", logging.WARNING,
                            "pid %d fd %d: dropping connection that is not %s (%d bytes, first byte 0x%s)",
                            p.tgid, c.fd, protocols.labels(), len(prefix), prefix[:1].hex() or "--")
            self._break(p, c, ev.tid)
            return None
        c.session = proto.session(self._session_config)
        return reads

    def _takes_digest(self, p: Proc, c: Conn, ev: SockIo, out: list) -> bool:
        """The kernel walks `c` as HTTP/2 (bpf/h2_walk.c): its session must be HTTP/2 too
        (or none yet, for its first read). Else the connection is followed no more."""
        if c.session is None or c.session.takes_digest:
            return True
        self._log.event("h2_digest_unexpected", logging.WARNING,
                        "pid %d fd %d: dropping connection the kernel walks as HTTP/2 but %s follows",
                        p.tgid, c.fd, type(c.session).__name__)
        self._break(p, c, ev.tid)
        self._drop_requests(p, c, ev.ts_ns, "malformed HTTP/2", out)
        return False

    def _break(self, p: Proc, c: Conn, tid: int, hides: bool = True) -> None:
        """No session can follow `c` any more: its threads lose thread/process attribution.
        `hides`: requests may go on unseen on it (not where the server never spoke HTTP/2)."""
        c.broken = True
        p.broken.setdefault(tid, set()).add(c.fd)
        if hides and c.session is not None and not c.session.serial and not c.hides:  # HTTP/2: unseen requests
            c.hides = True
            p.hidden += 1
        for t in [t for t, fd in p.partial_heads.items() if fd == c.fd]:
            del p.partial_heads[t]

    def _apply(self, p: Proc, c: Conn, events: list, tid: int, ts: int, out: list, unit: int = 0) -> None:
        """A session's events for one read, write or close (tid, ts, unit: that syscall's
        thread, time and execution unit)."""
        for e in events:
            kind = type(e)
            if kind is RequestStarted:
                old = c.streams.get(e.stream)
                if old is not None:  # a session that reuses an open stream: never two spans in one
                    self.stats.add("requests_incomplete")
                    self._finish(p, c, old, e.start_ns, "stream reused", out)
                req = self._new_request(p, c, e.head, e.start_ns, e.tid)
                self._activate(p, c, e.stream, req, out)
                if unit and c.session.serial:
                    self.calls.settle(p, p.contexts.serves(req, unit, tid, ts))
            elif kind is ResponseStatus:
                if (req := c.streams.get(e.stream)) is not None:
                    req.status = e.status
            elif kind is RequestFinished:
                if (req := c.streams.get(e.stream)) is not None:
                    if e.status is not None:
                        req.status = e.status
                    self._finish(p, c, req, e.ts_ns, e.error, out)
            elif kind is StreamReset:
                if (req := c.streams.get(e.stream)) is not None:
                    self.stats.add("requests_incomplete")
                    self._finish(p, c, req, e.ts_ns, e.reason, out)
            elif kind is ProtocolError:
                self._log.event(e.counter, e.level, "pid %d fd %d: %s", p.tgid, c.fd, e.message)
                self._break(p, c, tid, hides=e.hides)
                self._drop_requests(p, c, ts, e.drop_reason, out)
                return
            elif kind is SwitchProtocol:  # the old session's last event
                self._switch(p, c, e, tid, ts, out)
                return
            elif kind is Notice:
                if e.message is None:
                    self.stats.add(e.counter, e.count)
                else:
                    self._log.event(e.counter, e.level, "pid %d fd %d: %s", p.tgid, c.fd, e.message,
                                    count=e.count)

    def _switch(self, p: Proc, c: Conn, e: SwitchProtocol, tid: int, ts: int, out: list) -> None:
        """The connection speaks another protocol from here on (e.g. 101 to Upgrade: h2c):
        a new session; the requests it carries on keep their spans under their new stream
        ids; the rest of the switching write is the new protocol's."""
        h = e.handover
        c.draw = 0  # the kernel's draw was the upgrading request's: each stream is sampled on its own
        moved = {new: c.streams.pop(old) for old, (new, _) in h.streams.items() if old in c.streams}
        for req in list(c.streams.values()):
            self.stats.add("requests_incomplete")
            self._finish(p, c, req, ts, "protocol switched", out)
        c.streams = moved
        c.session = protocols.by_name(e.name).session(self._session_config, h)
        if h.rest_length:
            self._apply(p, c, c.session.on_write(h.rest, h.rest_length, h.tail, ts, tid), tid, ts, out)

    def _new_request(self, p: Proc, c: Conn, head, start_ns: int, tid: int) -> Request:
        req = Request(p.tgid, tid, c.fd, head, start_ns,
                      trace_id=self._rng.getrandbits(128) or 1,
                      span_id=self._rng.getrandbits(64) or 1,
                      sink=CallSink(self.s.span_budget), peer_addr=c.peer_addr,
                      peer_port=c.peer_port, listen_fd=c.listen_fd, server_port=c.server_port, tls=c.tls,
                      lost_before=p.records_lost)
        parent = parse_traceparent(head.headers.get("traceparent"))
        if parent:
            req.trace_id, req.parent_span_id = parent
            req.parent_trace_id = parent[0]
            req.parent_sampled = traceparent_sampled(head.headers.get("traceparent"))
            self.unsampled_parent_seen |= not req.parent_sampled
        elif c.draw:  # a root the kernel drew for: its decision and ours are the same
            req.trace_id = sampling.root_trace_id(self._rng, c.draw, not c.draw_taken, self.kernel_bound)
            c.draw_taken = True
        if self._sampler is not None:
            req.sampled = (sampling.root_sampled(self.root_bound, req.trace_id)
                           if not parent and self.root_bound is not None else
                           sampling.sampled(self._sampler, req.trace_id, head.path, SpanKind.SERVER,
                                            req.parent_span_id, req.parent_sampled))
        p.times.opened(req)
        return req

    def _activate(self, p: Proc, c: Conn, stream: int, req: Request, out: list) -> None:
        c.streams[stream] = req
        c.last_stream = max(c.last_stream, stream)
        p.opened(req)
        p.sampled_open += req.sampled
        self._note_quiet(p)
        self.s.serving[p.tgid] = p
        self.calls.opened(p, req)
        out.append(RequestOpened(req))  # the cost stage learns which requests may still overlap
        if c.go_h2_server is not None and (handler := p.go_h2.handler(c, stream)) is not None:
            self._serve(p, [(req, handler)], req.tid, req.start_ns)

    def on_go_h2(self, ev: GoH2Unit, out: list) -> None:
        """A goroutine of Go's HTTP/2 server began: a connection's reader or a stream's
        handler (pipeline/go_h2.py)."""
        p = self.s.proc(ev.tgid, out)
        self._serve(p, p.go_h2.began(ev, p.conns.values()), ev.tid, ev.ts_ns)

    def _serve(self, p: Proc, placed: list, tid: int, ts: int) -> None:
        """Binds each Go HTTP/2 handler goroutine placed to its request (contexts.serves)."""
        for req, handler in placed:
            self.calls.settle(p, p.contexts.serves(req, handler, tid, ts))

    def on_write(self, ev: SockIo, out: list) -> None:
        p = self.s.proc(ev.tgid, out)
        c = p.conns.get(ev.fd)
        if c is not None and c.own:
            return
        p.times.seen(ev)
        p.threads.io(ev.tid, ev.fd, c.streams.values() if c is not None else ())
        if c is None or c.broken:
            return
        if (ev.lost or c.resync) and self._resync(p, c, ev, out):
            return
        if c.session is None:
            self.stats.add("writes_without_request")
            return
        if ev.digest is not None and not self._takes_digest(p, c, ev, out):
            return
        binds = ev.ctx and (c.session.serial or not ev.ctx & GO_UNIT)
        if binds and len(c.streams) == 1:  # the writing context serves that request
            (req,) = c.streams.values()
            if not req.head.binds_at_own_headers:  # those: _responding_stream
                self.calls.settle(p, p.contexts.bind(req, ev))
        events = c.session.on_write(ev.digest or ev.data, ev.ret, ev.tail, ev.ts_ns, ev.tid)
        note_response(c, events, ev.ts_ns)
        if binds and (req := responding_stream(c, events)) is not None:
            self.calls.settle(p, p.contexts.bind(req, ev, ancestors=False))
        if c.session.written and p.handlers.pair_of_call(ev, c.streams.values()):  # before the events end streams
            p.handlers.wrote((ev.tid, ev.ctx), c.session.written, c.streams, ev.ts_ns)
        self._apply(p, c, events, ev.tid, ev.ts_ns, out, ev.ctx)

    def on_close(self, ev: SockClose, out: list) -> None:
        tgid, fd, ts = ev.tgid, ev.fd, ev.ts_ns
        p = self.s.procs.get(tgid)
        c = p.conns.get(fd) if p else None
        if c is None:
            return
        if ev.inode is not None and c.inode is not None and ev.inode != c.inode:
            # An earlier socket's close, read after the accept that took its number (a close
            # is seen at its exit: bpf/http_syscalls.c), which ended it already.
            self.stats.add("connection_closes_after_reuse")
            return
        if ev.lost and not c.broken:
            self._records_lost(p, c, ev.lost, ev.tid, ts, out)
        elif c.session is not None and not c.broken and not c.resync:
            self._apply(p, c, c.session.on_close(ts), 0, ts, out)
        elif c.prefix and not c.broken:
            self._log.event("connections_unknown_protocol", logging.INFO,
                            "pid %d fd %d: connection closed after %d bytes, too few to tell its protocol",
                            tgid, fd, len(c.prefix))
        self.drop_conn(p, c, ts, "connection closed before the response completed", out)

    def _resync(self, p: Proc, c: Conn, ev: SockIo, out: list) -> bool:
        """After records of `c` were lost (ev.lost; the kernel summarised their requests):
        HTTP/1 is parsed again from the next read that starts a request as the kernel
        delimits them (this one, if it does), by a new session; every record before it
        is ignored. True: ignore `ev`."""
        if ev.lost:
            self._records_lost(p, c, ev.lost, ev.tid, ev.ts_ns, out)
            if c.broken:
                return True
        if not (ev.req_start and ev.kind == EV_SOCK_READ):
            return True
        c.resync, c.session, c.prefix, c.early = False, None, b"", []
        return False

    def _records_lost(self, p: Proc, c: Conn, lost: int, tid: int, ts: int, out: list) -> None:
        """`lost` records of `c` went missing (ring buffer full). Its open requests end
        as records_lost (the kernel counted them: RequestSummary). A multiplexed session
        (HTTP/2: its header compression state went with the records) cannot go on."""
        self.stats.add("connection_records_lost", lost)
        p.records_lost += lost
        for req in list(c.streams.values()):
            req.records_lost = True
            self.stats.add("requests_records_lost")
            self._finish(p, c, req, ts, "records lost", out)
        for t in [t for t, fd in p.partial_heads.items() if fd == c.fd]:
            del p.partial_heads[t]
        if c.session is not None and not c.session.serial:
            self._log.event("connections_records_lost", logging.WARNING,
                            "pid %d fd %d: %d records lost (ring buffer full): this multiplexed connection "
                            "is followed no more", p.tgid, c.fd, lost)
            self._break(p, c, tid)
            return
        c.resync = True

    def drop_conn(self, p: Proc, c: Conn, ts: int, reason: str, out: list) -> None:
        self._drop_requests(p, c, ts, reason, out)
        if c.go_h2_server is not None:
            p.go_h2.closed(c)
        if p.conns.pop(c.fd, None) is c:
            p.untracked -= not c.tracked
            p.hidden -= c.hides
        for tid in [t for t, fd in p.partial_heads.items() if fd == c.fd]:
            del p.partial_heads[tid]
        for tid, fds in list(p.broken.items()):
            fds.discard(c.fd)
            if not fds:
                del p.broken[tid]

    def _drop_requests(self, p: Proc, c: Conn, ts: int, reason: str, out: list) -> None:
        for req in list(c.streams.values()):
            self.stats.add("requests_incomplete")
            self._finish(p, c, req, ts, reason, out)
        if c.session is not None:
            self._apply(p, c, c.session.abandon(), 0, ts, out)  # e.g. pipelined requests never answered

    def _finish(self, p: Proc, c: Conn, req: Request, ts: int, error: Optional[str], out: list) -> None:
        self._end(p, c, req, ts, error)
        if not req.sampled and req.sink.streamed:  # work the kernel could have counted (sampling.py)
            self.stats.add("cuda_calls_streamed_unsampled", req.sink.streamed)
        if p.untracked:
            req.untracked_connections = p.untracked
        req.lost_while_open = p.records_lost - req.lost_before
        if req.start_ns < p.probes_from_ns:
            req.before_probes = True
            self.stats.add("requests_before_probes")
        self.stats.add("requests_finished")
        out.append(req)

    def _end(self, p: Proc, c: Conn, req: Request, ts: int, error: Optional[str]) -> None:
        """`req` is no longer open: its process, thread times and held calls know it."""
        req.end_ns = max(ts, req.start_ns)
        req.error = error
        p.times.finished(req, ts)
        for stream in [k for k, r in c.streams.items() if r is req]:
            del c.streams[stream]
        if p.closed(req):
            p.sampled_open -= req.sampled
            self._note_quiet(p)
            if not p.open:
                self.s.serving.pop(p.tgid, None)
        self.calls.finished(p, req)

    def _note_quiet(self, p: Proc) -> None:
        """Whether `p` has no sampled request open (and, unless the sampler drops traces
        that start here, some request open), when that changes: the collector tells the
        kernel (bpf/maps.h quiet_procs)."""
        if self._sampler is None:
            return
        quiet = not p.sampled_open and (bool(p.open) or self.s.quiet_when_idle)
        if quiet != p.quiet:
            p.quiet = self.quiet[p.tgid] = quiet
