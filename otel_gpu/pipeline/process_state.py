"""What the stitcher keeps (StitchState): per traced process (Proc) and per server
connection (Conn); its two halves, pipeline/connections.py and pipeline/attribution.py,
share one StitchState and read and change it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from ..ratelimit import RateLimitedLog, Stats
from ..records import ProcessSeen
from .contexts import ProcessContexts
from .go_h2 import GoH2Streams
from .handlers import HandlerPairs
from .held import Holds
from .model import ProcessWindow
from .protocols.base import Session
from .rule_facts import begun
from .threads import ThreadProof
from .time_split import ThreadTimes


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
    hides: bool = False     # broken with a multiplexed session: requests on it go unseen (Proc.hidden)
    resync: bool = False    # records of it were lost: ignored until a read starts a request (HTTP/1)
    tracked: bool = True    # False: accepted while the kernel's table was full; its I/O is not seen
    own: bool = False       # the collector's own export connection (Accept.own): ignored
    go_h2_server: Optional[int] = None  # the Go serverConn serving it (pipeline/go_h2.py)
    read_by: int = 0        # the goroutine of its latest read (multiplexed sessions)
    last_stream: int = 0    # the highest stream id a request opened on (HTTP/2 ids only grow)
    inode: Optional[int] = None  # its socket: its accept's or seed's, else the first audit's (a reused fd is another)
    # The kernel's draw for the request it delimits now (SockIo.draw), and whether a
    # request took it: pipelining's next heads take draws on the same side of the bound.
    draw: int = 0
    draw_taken: bool = False

    def is_socket(self, inode: Optional[int], peer: tuple) -> bool:
        """Is this the socket an accept names? By inode where both know it, else by its
        peer (addr, port)."""
        if self.inode is not None and inode is not None:
            return self.inode == inode
        return (self.peer_addr, self.peer_port) == peer


@dataclass
class Proc:
    tgid: int
    conns: dict = field(default_factory=dict)   # fd -> Conn
    records_lost: int = 0  # connection records lost (ring buffer full), as the next records told
    probes_from_ns: int = 0  # its CUDA calls are seen from then on (records.ProcessSeen)
    open: list = field(default_factory=list)    # open Requests (opened() and closed() keep the next two)
    open_on: dict = field(default_factory=dict)  # tid -> the open Requests whose heads it read, as in `open`
    latest_start: int = 0  # the latest start_ns of an open request (0: none)
    ambiguous: Optional[ProcessWindow] = None
    shared: Optional[ProcessWindow] = None  # the batch step in progress (cut at syncs)
    outside: Optional[ProcessWindow] = None
    device_by_tid: dict = field(default_factory=dict)
    # Threads holding a half-read request head (fd): serving something we cannot see,
    # so their calls are never handed to another request by "process" attribution.
    partial_heads: dict = field(default_factory=dict)
    # Threads that served a connection that is not HTTP/1.x (tid -> fds): nor "thread".
    broken: dict = field(default_factory=dict)
    # Its one hold engine and the unit policies that feed it (pipeline/held.py):
    holds: Optional[Holds] = None
    contexts: Optional[ProcessContexts] = None  # Python contexts and goroutines
    threads: Optional[ThreadProof] = None  # threads' proof that they served one request alone
    handlers: Optional[HandlerPairs] = None  # handler threads of multiplexed connections
    policies: dict = field(default_factory=dict)  # policy name (rules.Rule.holds) -> the policy
    go_h2: Optional[GoH2Streams] = None  # Go HTTP/2 handler goroutines and their streams
    untracked: int = 0  # open connections the kernel does not track (Conn.tracked False)
    hidden: int = 0  # open multiplexed connections no session follows any more (Conn.hides)
    sampled_open: int = 0  # open requests whose trace is sampled
    quiet: bool = False    # all its open requests are unsampled (as the kernel was last told)
    times: ThreadTimes = field(default_factory=ThreadTimes)  # its threads' time sums (pipeline/time_split.py)

    # The rules read the open requests at every call: kept so that reading them is no scan
    # of all of them (a server with hundreds in flight).
    def opened(self, req) -> None:
        self.open.append(req)
        self.open_on.setdefault(req.tid, []).append(req)
        self.latest_start = max(self.latest_start, req.start_ns)

    def closed(self, req) -> bool:
        """`req` is open no more; False when it was not open."""
        try:
            self.open.remove(req)  # by identity (model.Request)
        except ValueError:
            return False
        on = self.open_on[req.tid]
        on.remove(req)
        if not on:
            del self.open_on[req.tid]
        if req.start_ns >= self.latest_start:
            self.latest_start = max((r.start_ns for r in self.open), default=0)
        return True

    def open_at(self, ts: int) -> list:
        """begun(open, ts), the open requests that had begun by `ts` (the list itself while
        every one had, as begun returns it), without a scan in that case."""
        return self.open if ts >= self.latest_start else begun(self.open, ts)


class StitchState:
    """Every traced process, by tgid, and what both halves of the stitcher read of them:
    the processes with open requests (serving), their groups of related processes
    (ProcessGroup records), the span budget, the counters and the rate-limited log."""

    def __init__(self, span_budget: int, stats: Stats, ratelog: RateLimitedLog, quiet_when_idle: bool) -> None:
        self.span_budget, self.stats, self.log = span_budget, stats, ratelog
        self.quiet_when_idle = quiet_when_idle  # sampling.drops_roots(): new processes start quiet
        self.procs: dict[int, Proc] = {}
        self.groups: dict[int, Optional[str]] = {}  # tgid -> its group of related processes
        self.serving: dict[int, Proc] = {}  # processes with open requests

    def proc(self, tgid: int, out: list) -> Proc:
        """The process's state, made (with a ProcessSeen record) when first met."""
        p = self.procs.get(tgid)
        if p is None:
            p = self.procs[tgid] = Proc(tgid, quiet=self.quiet_when_idle)
            p.holds = Holds(p, self.span_budget, self.stats, self.log)
            p.contexts = ProcessContexts(p.holds, self.stats)
            p.threads = ThreadProof(p.holds)
            p.handlers = HandlerPairs(tgid, p.holds, p.contexts, self.log)
            p.policies = {policy.name: policy for policy in (p.contexts, p.threads, p.handlers)}
            p.go_h2 = GoH2Streams(tgid, self.log)
            out.append(ProcessSeen(tgid))
        return p

    def conn(self, p: Proc, fd: int) -> Conn:
        c = p.conns.get(fd)
        if c is None:  # accepted before the collector saw it: peer unknown
            c = p.conns[fd] = Conn(fd)  # (pipeline/proc_facts.py makes an Accept for it first)
        return c
