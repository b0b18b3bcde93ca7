"""Stitches socket and CUDA events into requests, by process and thread.

A request opens when its head is read (or, pipelined, when the response before it
completes) and closes when its response has been written completely or the
connection goes away. Where each CUDA call goes (a request, or a window of its process:
ambiguous, shared, outside) is pipeline/attribution.py, the Stitcher's other half.
Which protocol a connection speaks is told by its first bytes (protocols.detect); its
session (protocols/<name>/) turns reads and writes into request events, so nothing here
knows a protocol's bytes; a session may hand its connection to another protocol's
(SwitchProtocol: HTTP/1.1 Upgrade: h2c), its open requests going on under it. A thread
serving a connection no session can follow (not a known protocol, or bytes its protocol
refused) gives no thread/process attribution, nor does a process with connections the
kernel could not track (its table was full: their requests are not seen); such a
process's spans carry how many it had. Response writes bind requests to the Python
contexts that serve them (pipeline/contexts.py, pipeline/handlers.py).

Time arrives as Tick records: at each, the ambiguous/shared/outside windows collected so
far go out; at the final one (collector stopping), every open request is closed too."""
from __future__ import annotations

import logging
import random
from dataclasses import dataclass, field
from typing import Optional

from opentelemetry.trace import SpanKind

from ..ratelimit import RateLimitedLog, Stats
from . import protocols
from .protocols.base import (DETECT_MAX, Notice, ProtocolError, RequestFinished, RequestStarted, ResponseStatus,
                             Session, SessionConfig, StreamReset, SwitchProtocol)
from .attribution import CallAttribution
from .contexts import ProcessContexts
from .handlers import HandlerPairs
from .steps import BatchSteps
from .threads import ThreadProof
from .model import ATTRIBUTIONS, CallSink, ProcessWindow, Request
from .rules import RULES
from .records import (Accept, CallAggregate, RequestOpened, ContextCopy, CudaCall, EV_SOCK_READ, KernelRollup,
                      ProcessGone, ProcessSeen, ProcExit, SockClose, SockIo, Tick, UnitWake)
from . import sampling
from .traceparent import parse_traceparent, traceparent_sampled

log = logging.getLogger(__name__)
AUDIT_ALL_NS = 60 * 10**9  # how often every connection is checked against /proc


@dataclass
class Conn:
    fd: int
    peer_addr: Optional[str] = None
    peer_port: Optional[int] = None
    listen_fd: int = -1
    session: Optional[Session] = None  # chosen by the first bytes read (protocols.detect)
    prefix: bytes = b""  # the first bytes while no protocol can tell yet (at most DETECT_MAX)
    early: list = field(default_factory=list)  # their reads, replayed into the session
    streams: dict = field(default_factory=dict)  # stream id -> open Request (HTTP/1: stream 0)
    server_port: Optional[int] = None
    tls: bool = False       # its bytes come from the SSL probes (HTTPS)
    broken: bool = False    # no session can follow it: ignored until closed
    tracked: bool = True    # False: accepted while the kernel's table was full; its I/O is not seen
    inode: Optional[int] = None  # its socket, learnt at the first audit (a reused fd is another socket)


@dataclass
class Proc:
    tgid: int
    conns: dict = field(default_factory=dict)   # fd -> Conn
    open: list = field(default_factory=list)    # open Requests
    ambiguous: Optional[ProcessWindow] = None
    shared: Optional[ProcessWindow] = None  # the batch step in progress (cut at syncs)
    outside: Optional[ProcessWindow] = None
    device_by_tid: dict = field(default_factory=dict)
    # Threads holding a half-read request head (fd): serving something we cannot see,
    # so their calls are never handed to another request by "process" attribution.
    partial_heads: dict = field(default_factory=dict)
    # Threads that served a connection that is not HTTP/1.x (tid -> fds): nor "thread".
    broken: dict = field(default_factory=dict)
    contexts: Optional[ProcessContexts] = None
    pairs: Optional[HandlerPairs] = None  # handler threads of multiplexed connections
    threads: Optional[ThreadProof] = None  # threads' proof that they served one request alone
    untracked: int = 0  # open connections the kernel does not track (Conn.tracked False)
    sampled_open: int = 0  # open requests whose trace is sampled
    quiet: bool = False    # all its open requests are unsampled (as the kernel was last told)


class Stitcher(CallAttribution):
    def __init__(self, span_budget: int = 256, extra_headers: frozenset = frozenset(),
                 stats: Optional[Stats] = None, rng: Optional[random.Random] = None,
                 port_of=None, peer_of=None, group_of=None, sockets_of=None, sampler=None,
                 quiet_when_idle: bool = False) -> None:
        self.span_budget = span_budget
        self.extra_headers = extra_headers
        self._session_config = SessionConfig(extra_headers)
        self.stats = stats or Stats()
        self._log = RateLimitedLog(log, self.stats, interval_s=30.0)
        self._rng = rng or random.Random()
        self._port_of = port_of  # (pid, listen_fd, conn_fd) -> server port, or None
        self._peer_of = peer_of  # (pid, conn_fd) -> (address, port) or None: accepts without one
        self._group_of = group_of  # pid -> group key or None (pipeline/groups.py): related processes
        self._sockets_of = sockets_of  # pid -> {fd: socket inode} (pipeline/sockets.py): closes not seen
        self._sampler = sampler  # pipeline/sampling.py; None: every trace sampled
        self.quiet_when_idle = quiet_when_idle  # sampling.drops_roots(): the collector marks new processes quiet
        self.quiet: dict[int, bool] = {}  # tgid -> whether all its open requests are unsampled, as changed
        self._next_audit_ns = 0
        self.procs: dict[int, Proc] = {}
        self._serving: dict[int, Proc] = {}  # processes with open requests
        self.attributed = dict.fromkeys(ATTRIBUTIONS, 0)
        self.by_rule = dict.fromkeys((r.name for r in RULES), 0)  # calls by the rule that decided them
        self.steps = BatchSteps()  # shared windows waiting for their members (pipeline/steps.py)

    # --- stage interface -------------------------------------------------------
    def process(self, events: list) -> list:
        out: list = []
        for ev in events:
            if isinstance(ev, CudaCall):
                self._on_cuda(ev, out)
            elif isinstance(ev, SockIo):
                if ev.kind == EV_SOCK_READ:
                    self._on_read(ev, out)
                else:
                    self._on_write(ev, out)
            elif isinstance(ev, ContextCopy):
                self._proc(ev.tgid, out).contexts.copied(ev)
            elif isinstance(ev, UnitWake):
                self._proc(ev.tgid, out).contexts.wake(ev)
            elif isinstance(ev, Accept):
                self._on_accept(ev, out)
            elif isinstance(ev, SockClose):
                self._on_close(ev.tgid, ev.fd, ev.ts_ns, out)
            elif isinstance(ev, CallAggregate):
                self._on_aggregate(ev, out)
            elif isinstance(ev, KernelRollup):
                self._on_kernel_rollup(ev, out)
            elif isinstance(ev, ProcExit):
                self._on_exit(ev, out)
            elif isinstance(ev, Tick):
                if ev.final:
                    self._close_all(ev.now_ns, "collector stopped", out)
                for p in self.procs.values():
                    p.contexts.sweep(ev.now_ns, min((r.start_ns for r in p.open), default=None))
                self._audit_connections(ev.now_ns, out)
                self._flush_windows(out)
                self.steps.tick(ev.now_ns, out, ev.final)
                out.append(ev)
            else:  # not for this stage (e.g. ProcessSeen from discovery): pass it on
                out.append(ev)
        return out

    def state(self) -> dict:
        procs = self.procs.values()
        sizes = {"procs": len(self.procs), "conns": sum(len(p.conns) for p in procs),
                 "conns_untracked": sum(p.untracked for p in procs),
                 "open_requests": sum(len(p.open) for p in procs),
                 "contexts_tracked": 0, "contexts_bound": 0, "pending_calls": 0}
        for k, v in (kv for p in procs for kv in p.contexts.state().items()):
            sizes[k] += v
        sizes.update(self.steps.state())
        sizes["pending_calls"] += sum(p.pairs.held for p in procs)  # held for a handler thread's stream
        return sizes

    def _close_all(self, now_ns: int, reason: str, out: list) -> None:
        """Collector stopping: every open request is finished with an error."""
        for p in list(self.procs.values()):
            for conn in list(p.conns.values()):
                self._drop_conn(p, conn, now_ns, reason, out)
            self._settle(p, p.contexts.drain() + p.pairs.drain())

    # --- processes and connections ----------------------------------------------
    def _proc(self, tgid: int, out: list) -> Proc:
        p = self.procs.get(tgid)
        if p is None:
            p = self.procs[tgid] = Proc(tgid, quiet=self.quiet_when_idle)
            p.contexts = ProcessContexts(tgid, self.span_budget, self.stats, self._log)
            p.pairs = HandlerPairs(tgid, self.stats, self._log)
            p.threads = ThreadProof(tgid, self.span_budget, self.stats, self._log)
            out.append(ProcessSeen(tgid))
        return p

    def _conn(self, p: Proc, fd: int) -> Conn:
        c = p.conns.get(fd)
        if c is None:  # accepted before the collector saw it: peer unknown
            c = p.conns[fd] = Conn(fd)
            c.server_port = self._port_of(p.tgid, -1, fd) if self._port_of else None
        return c

    def _on_accept(self, ev: Accept, out: list) -> None:
        p = self._proc(ev.tgid, out)
        if ev.fd in p.conns:  # the old connection's close was not seen (or it is seeded again)
            self._drop_conn(p, p.conns[ev.fd], ev.ts_ns, "connection replaced", out)
        if not ev.tracked:  # counted by the kernel (connections_untracked); released by the audit
            p.conns[ev.fd] = Conn(ev.fd, tracked=False)
            p.untracked += 1
            return
        peer = (ev.peer_addr, ev.peer_port)
        if peer[0] is None and self._peer_of:  # accept(fd, NULL, NULL), as uvloop/libuv do
            peer = self._peer_of(ev.tgid, ev.fd) or peer
        c = p.conns[ev.fd] = Conn(ev.fd, *peer, ev.listen_fd)
        c.server_port = self._port_of(ev.tgid, ev.listen_fd, ev.fd) if self._port_of else None

    def _on_read(self, ev: SockIo, out: list) -> None:
        p = self._proc(ev.tgid, out)
        c = self._conn(p, ev.fd)
        p.threads.io(ev.tid, ev.fd, c.streams.values())
        c.tls = c.tls or ev.tls
        if ev.ctx:
            p.contexts.seen(ev.tid, ev.ctx, ev.ts_ns)
        if c.broken:
            p.broken.setdefault(ev.tid, set()).add(ev.fd)
            return
        if c.session is not None:
            reads = ((ev.data, ev.ret, ev.ts_ns, ev.tid, ev.ctx),)
        elif (reads := self._detect(p, c, ev)) is None:
            return
        for data, length, ts, tid, unit in reads:
            self._apply(p, c, c.session.on_read(data, length, ts, tid), tid, ts, out, unit)
            if c.broken:
                return
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
        c.early.append((ev.data, ev.ret, ev.ts_ns, ev.tid, ev.ctx))
        proto = protocols.detect(c.prefix)
        if proto is protocols.PENDING:
            if ev.ret <= len(ev.data):
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

    def _break(self, p: Proc, c: Conn, tid: int) -> None:
        """No session can follow `c` any more: its threads lose thread/process attribution."""
        c.broken = True
        p.broken.setdefault(tid, set()).add(c.fd)
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
                    self._settle(p, p.contexts.read_head(req, unit, tid, ts))
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
                self._break(p, c, tid)
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
                      sink=CallSink(self.span_budget), peer_addr=c.peer_addr,
                      peer_port=c.peer_port, listen_fd=c.listen_fd, server_port=c.server_port, tls=c.tls)
        parent = parse_traceparent(head.headers.get("traceparent"))
        if parent:
            req.trace_id, req.parent_span_id = parent
            req.parent_trace_id = parent[0]
            req.parent_sampled = traceparent_sampled(head.headers.get("traceparent"))
        if self._sampler is not None:
            req.sampled = sampling.sampled(self._sampler, req.trace_id, head.path, SpanKind.SERVER,
                                           req.parent_span_id, req.parent_sampled)
        return req

    def _activate(self, p: Proc, c: Conn, stream: int, req: Request, out: list) -> None:
        c.streams[stream] = req
        p.open.append(req)
        p.sampled_open += req.sampled
        self._note_quiet(p)
        self._serving[p.tgid] = p
        p.contexts.opened(req)
        p.threads.opened(req)
        out.append(RequestOpened(req))  # the cost stage learns which requests may still overlap

    def _note_quiet(self, p: Proc) -> None:
        """Whether `p` has no sampled request open (and, unless the sampler drops traces
        that start here, some request open), when that changes: the collector tells the
        kernel (bpf/maps.h quiet_procs)."""
        if self._sampler is None:
            return
        quiet = not p.sampled_open and (bool(p.open) or self.quiet_when_idle)
        if quiet != p.quiet:
            p.quiet = self.quiet[p.tgid] = quiet

    def _on_write(self, ev: SockIo, out: list) -> None:
        p = self._proc(ev.tgid, out)
        c = p.conns.get(ev.fd)
        p.threads.io(ev.tid, ev.fd, c.streams.values() if c is not None else ())
        if c is None or c.broken:
            return
        if c.session is None:
            self.stats.add("writes_without_request")
            return
        if ev.ctx and len(c.streams) == 1:  # the writing context serves that request
            (req,) = c.streams.values()
            if not req.head.binds_at_own_headers:  # those: _responding_stream
                self._settle(p, p.contexts.bind(req, ev))
        events = c.session.on_write(ev.data, ev.ret, ev.tail, ev.ts_ns, ev.tid)
        self._note_response(c, events, ev.ts_ns)
        if ev.ctx and (req := self._responding_stream(c, events)) is not None:
            self._settle(p, p.contexts.bind(req, ev, ancestors=False))
        if c.session.written and self._handler_pair(p, ev, c.streams.values()):  # before the events end streams
            p.pairs.wrote((ev.tid, ev.ctx), c.session.written, c.streams, ev.ts_ns)
        self._apply(p, c, events, ev.tid, ev.ts_ns, out, ev.ctx)

    @staticmethod
    def _note_response(c: Conn, events: list, ts: int) -> None:
        """What a write did for the requests it answers (pipeline/steps.py's evidence):
        their response headers went out (the status was not known before it), or a body
        chunk did (headers with the end of the response count as its last chunk). A
        streamed response answers at each chunk; any other at its first write (its head:
        the body may follow in another write). Called before the events are applied."""
        for stream in c.session.written or c.streams:  # HTTP/1: its one open request, stream 0
            r = c.streams.get(stream)
            if r is None:
                continue
            head = done = False
            for e in events:
                if getattr(e, "stream", None) == stream:
                    if type(e) is ResponseStatus and r.status is None:
                        head, r.streamed = True, e.streamed
                    done = done or type(e) is RequestFinished
            if head and not r.headers_ts:
                r.headers_ts = ts
            body = done or not head
            r.chunks += body
            if (head and not r.streamed) or (body and r.streamed is not False):
                r.answered(ts)

    @staticmethod
    def _responding_stream(c: Conn, events: list) -> Optional[Request]:
        """The HTTP/2 request whose response headers this write carries, with no other
        stream's frames. Its writing context is that stream's own task when
        pipeline/contexts.py finds it tracked and newer than the request: hypercorn
        writes each stream's HEADERS from the stream's app task (measured), while its
        per-connection send task writes DATA for all streams. Any write binding, as on an
        HTTP/1 connection with one request, would bind that send task: made by the read
        that opened the first streams, it is newer than they are. For the same reason only
        the writing context binds, not its ancestors (a per-connection task can be every
        stream task's parent); a task the stream's task spawns is the stream's too.
        Not gRPC: C-core writes whatever frames are queued, from whichever thread holds its
        combiner, so with several RPCs open a write's context proves nothing (their pool
        threads: pipeline/handlers.py); with one open, any write binds as on HTTP/1 (C-core
        has no per-connection task in Python).
        What the rule assumes and the records cannot show: a task that writes one
        stream's response headers serves that stream. A server whose single writer task,
        made by the read that opened the first streams, wrote every stream's headers in
        turn would have that task bound to the first stream (its own CUDA calls, if it
        made any, would go there; its streams' tasks' calls would not)."""
        if len(c.session.written) != 1:  # HTTP/1 sessions carry no stream ids: empty
            return None
        (stream,) = c.session.written
        req = c.streams.get(stream)
        if req is None or not req.head.binds_at_own_headers:
            return None
        return req if any(type(e) is ResponseStatus and e.stream == stream for e in events) else None

    def _on_close(self, tgid: int, fd: int, ts: int, out: list) -> None:
        p = self.procs.get(tgid)
        c = p.conns.get(fd) if p else None
        if c is None:
            return
        if c.session is not None and not c.broken:
            self._apply(p, c, c.session.on_close(ts), 0, ts, out)
        elif c.prefix and not c.broken:
            self._log.event("connections_unknown_protocol", logging.INFO,
                            "pid %d fd %d: connection closed after %d bytes, too few to tell its protocol",
                            tgid, fd, len(c.prefix))
        self._drop_conn(p, c, ts, "connection closed before the response completed", out)

    def _drop_conn(self, p: Proc, c: Conn, ts: int, reason: str, out: list) -> None:
        self._drop_requests(p, c, ts, reason, out)
        if p.conns.pop(c.fd, None) is c and not c.tracked:
            p.untracked -= 1
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
        req.end_ns = max(ts, req.start_ns)
        req.error = error
        for stream in [k for k, r in c.streams.items() if r is req]:
            del c.streams[stream]
        if req in p.open:
            p.open.remove(req)
            p.sampled_open -= req.sampled
            self._note_quiet(p)
            if not p.open:
                self._serving.pop(p.tgid, None)
        self._settle(p, p.contexts.finished(req) + p.pairs.finished(req) + p.threads.finished(req))
        if p.untracked:
            req.untracked_connections = p.untracked
        self.stats.add("requests_finished")
        out.append(req)

    def _on_exit(self, ev: ProcExit, out: list) -> None:
        # ProcessGone even for a process never seen here (its calls were only counted
        # in the kernel): the collector still has its BPF entries to drop.
        p = self.procs.pop(ev.tgid, None)
        if p is not None:
            for c in list(p.conns.values()):
                self._drop_conn(p, c, ev.ts_ns, "process exited", out)
            self._settle(p, p.contexts.drain() + p.pairs.drain())
            self._serving.pop(ev.tgid, None)
            self._flush_process_windows(p, out)
        self.steps.gone(ev.tgid, ev.ts_ns, out)
        out.append(ProcessGone(ev.tgid, ev.comm))

    def _audit_connections(self, now_ns: int, out: list) -> None:
        """Releases connections whose close was never seen: untracked ones (their I/O is
        not seen) at every Tick, every idle one each AUDIT_ALL_NS (a close lost with a
        full ring buffer). A connection is gone when its fd is no longer the socket it was."""
        if self._sockets_of is None:
            return
        everyone = now_ns >= self._next_audit_ns
        if everyone:
            self._next_audit_ns = now_ns + AUDIT_ALL_NS
        for p in list(self.procs.values()):
            if not p.conns or not (everyone or p.untracked):
                continue
            fds = self._sockets_of(p.tgid)
            for c in list(p.conns.values()):
                if c.streams or (c.tracked and not everyone):
                    continue  # a request in flight: its close is on its way
                inode = fds.get(c.fd)
                if inode is not None and c.inode in (None, inode):
                    c.inode = inode
                    continue
                if c.tracked:
                    self.stats.add("connection_closes_unseen")
                self._drop_conn(p, c, now_ns, "connection closed (close not seen)", out)
