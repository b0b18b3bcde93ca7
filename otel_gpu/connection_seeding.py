"""Connections the kernel never saw accepted, made known to it and to the pipeline: the
keep-alive connections a process held before it was traced, those the kernel's full table
left untracked, and, every PRUNE_INTERVAL_S, the kernel entries whose close was never seen
(they go, with a SockClose record each). Also each related server's share of the table.
The collector (collector.py) calls it at its scans and flushes."""
from __future__ import annotations

import logging
import time

from .records import Accept, SockClose
from .sockets import existing_server_connections, open_sockets

log = logging.getLogger("otel_gpu")

PRUNE_INTERVAL_S = 30.0  # kernel connection entries whose close was never seen are dropped this often
FIRST_SEED = "opened before tracing"


class ConnectionSeeding:
    def __init__(self, table, proc_root: str, max_connections: int, stats) -> None:
        """`table()`: the running program's connection table (kernel_io/connection_table.py)."""
        self.table, self.proc_root, self.max_connections, self.stats = table, proc_root, max_connections, stats
        self.pending: set[int] = set()  # processes with connections still to seed
        self._untracked_seen = 0
        self._next_prune = time.monotonic() + PRUNE_INTERVAL_S

    def share(self, servers: set) -> None:
        """Each traced related server's share of the connection table (its own CUDA
        processes have none: they keep what the servers cannot take)."""
        from .kernel_io.connection_table import related_server_share
        share = related_server_share(self.max_connections, len(servers))
        self.table().set_shares({pid: share for pid in servers})

    def seed(self, pids: set, why: str = FIRST_SEED) -> list:
        """Accept records for the keep-alive connections new processes already held, so
        their next request is traced (the real accept happened before us), or that the
        kernel's full table left untracked. A process with more connections than one scan
        seeds (SEED_PER_SCAN), or some the full table left out, is seeded again at the next
        flush; one past its share is not."""
        now, out = time.monotonic_ns(), []
        for pid in sorted(pids):
            held = {c.fd: c for c in existing_server_connections(self.proc_root, pid)}
            fds, short = self.table().seed(pid, {fd: c.inode for fd, c in held.items()})
            if short in ("per scan", "table full"):
                self.pending.add(pid)
            else:
                self.pending.discard(pid)
            if fds or (short and why == FIRST_SEED):
                rest = {"share": "; the others stay untracked (its share of --max-connections)",
                        "per scan": "; more at the next flush", "table full": "; the others once there is room"}
                log.info("pid %d: %d connections %s are followed from their next request%s", pid, len(fds), why,
                         rest.get(short, ""))
            out += [Accept(pid, pid, now, fd, held[fd].listen_fd, held[fd].peer_addr, held[fd].peer_port,
                           inode=held[fd].inode) for fd in fds]
        return out

    def at_flush(self, traced: set) -> list:
        """At each flush: connections the full table left untracked are seeded once there
        is room (from /proc, like those opened before tracing), and those a scan had no
        time for; every PRUNE_INTERVAL_S, kernel entries whose close was never seen go,
        with a SockClose record each. `traced`: every traced process, servers included."""
        out = []
        untracked = self.stats.snapshot().get("connections_untracked", 0)
        if untracked > self._untracked_seen:
            self._untracked_seen = untracked
            out += self.seed(traced, "left untracked (table full)")
        elif self.pending:
            out += self.seed(self.pending & traced, "still to seed")
        now = time.monotonic()
        if now >= self._next_prune:
            self._next_prune = now + PRUNE_INTERVAL_S
            ts = time.monotonic_ns()
            out += [SockClose(tgid, tgid, ts, fd) for tgid, fd in
                    self.table().prune(lambda pid: open_sockets(self.proc_root, pid))]
        return out

    def forget(self, gone: set) -> None:
        self.pending -= gone
