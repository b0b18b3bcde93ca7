"""What the stitcher keeps per traced process (Proc) and per server connection (Conn);
its two halves, pipeline/connections.py and pipeline/attribution.py, read and change it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .contexts import ProcessContexts
from .handlers import HandlerPairs
from .model import ProcessWindow
from .protocols.base import Session
from .threads import ThreadProof


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
    inode: Optional[int] = None  # its socket, learnt at the first audit (a reused fd is another socket)
    # The kernel's draw for the request it delimits now (SockIo.draw), and whether a
    # request took it: pipelining's next heads take draws on the same side of the bound.
    draw: int = 0
    draw_taken: bool = False


@dataclass
class Proc:
    tgid: int
    conns: dict = field(default_factory=dict)   # fd -> Conn
    records_lost: int = 0  # connection records lost (ring buffer full), as the next records told
    probes_from_ns: int = 0  # its CUDA calls are seen from then on (records.ProcessSeen)
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
    hidden: int = 0  # open multiplexed connections no session follows any more (Conn.hides)
    sampled_open: int = 0  # open requests whose trace is sampled
    quiet: bool = False    # all its open requests are unsampled (as the kernel was last told)
