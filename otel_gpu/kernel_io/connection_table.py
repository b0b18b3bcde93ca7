"""The kernel's connection table (`conns`, bpf/http_probes.c) from user space: the
connections a process held before it was traced, seeded from /proc; each related
server's share of the table (`conn_shares`); and the entries whose close the kernel
never saw, pruned."""
from __future__ import annotations

import ctypes as ct
import logging
from typing import Optional

from .run_program import run_raw_tracepoint

log = logging.getLogger(__name__)

# Connections seeded from /proc per process and scan: a listener holding tens of
# thousands is seeded over several flushes, and the collector answers in between.
SEED_PER_SCAN = 1024
MIN_SHARE = 16  # connections a related server may always hold


def related_server_share(max_connections: int, servers: int) -> int:
    """Connections each traced related HTTP server may hold in the kernel's table:
    together at most half of it, so the CUDA processes (no share, bounded by the table
    alone) keep the other half whatever a front proxy or a flood does."""
    return max(MIN_SHARE, max_connections // (2 * max(1, servers)))


class ConnectionTable:
    def __init__(self, bpf) -> None:
        self.bpf = bpf
        self._prune_suspects: set = set()  # (tgid, fd) found without a socket once
        self._kernel_forgets = True  # False once the kernel would not run forget_unseen_close

    def seed(self, tgid: int, fds: dict) -> tuple[list, Optional[str]]:
        """Server connections the process held before we traced it (their accept was never
        seen), or that a full table left untracked: from now on their next read is parsed
        like any other. `fds`: fd -> its socket's inode number, which the kernel's close
        check compares (bpf/http_syscalls.c). At most SEED_PER_SCAN at a time, within the
        process's share. Returns the fds seeded, and why it stopped short ("table full",
        "share", "per scan")."""
        table, shares = self.bpf["conns"], self.bpf["conn_shares"]
        share = shares.get(ct.c_uint32(tgid))
        room = SEED_PER_SCAN if share is None else min(SEED_PER_SCAN, share.limit - share.used)
        seeded, why = [], None
        for fd in fds:
            key = table.Key(tgid, fd)
            if key in table:
                continue
            if len(seeded) >= room:
                why = "per scan" if room == SEED_PER_SCAN else "share"
                break
            leaf = table.Leaf()  # state unknown: the next read decides
            leaf.counted = share is not None
            leaf.ino = fds[fd]
            try:
                table[key] = leaf
            except Exception:  # bcc raises a plain Exception when the map is full
                why = "table full"
                break
            seeded.append(fd)
        if share is not None and seeded:
            self._add_used(tgid, len(seeded))
        return seeded, why

    def set_shares(self, limits: dict) -> None:
        """pid -> connections that traced related server may hold (conn_shares)."""
        shares = self.bpf["conn_shares"]
        for pid, limit in limits.items():
            old = shares.get(ct.c_uint32(pid))
            if old is None or old.limit != limit:
                shares[ct.c_uint32(pid)] = shares.Leaf(0 if old is None else old.used, limit)

    def _add_used(self, tgid: int, delta: int) -> None:
        """Seeds and prunes counted in the share: a read then a write, so an accept or a
        close the kernel counts in between is lost (a few entries at worst: a share is
        a bound on a flood, not a tally)."""
        shares = self.bpf["conn_shares"]
        share = shares.get(ct.c_uint32(tgid))
        if share is not None:
            shares[ct.c_uint32(tgid)] = shares.Leaf(max(0, share.used + delta), share.limit)

    def prune(self, socket_fds) -> list[tuple[int, int]]:
        """Drops the connection entries whose fd is no longer a socket of the process
        (`socket_fds(pid)` -> set of fds; a gone process has none): closes the kernel
        never saw (close_range, dup2, an fd seeded as it closed). The table is a plain
        hash, so nothing else would free them. An entry goes only when two calls in a
        row find it so, and only the one listed (by its socket's inode): a connection
        accepted on the fd since is another socket, and stays. Returns the (tgid, fd)
        dropped."""
        table, fds, dropped, suspects = self.bpf["conns"], {}, [], set()
        for k, v in list(table.items()):
            if k.tgid not in fds:
                fds[k.tgid] = socket_fds(k.tgid)
            if k.fd in fds[k.tgid]:
                continue
            if (k.tgid, k.fd) not in self._prune_suspects:
                suspects.add((k.tgid, k.fd))
                continue
            if self._forget_unseen_close(table, k, v.ino):
                dropped.append((k.tgid, k.fd))
        self._prune_suspects = suspects
        return dropped

    def _forget_unseen_close(self, table, key, ino: int) -> bool:
        """The kernel forgets the connection as if it had seen its close (bpf/http_syscalls.c
        forget_unseen_close): its process's http_active, share and SSL tie go with it.
        Where the kernel cannot run it for us (Linux < 5.10), the entry is deleted here,
        its share given back, and http_active left as it is (logged once): the process's
        calls may then stream outside requests. Whether the entry (socket `ino`) was still there."""
        if self._kernel_forgets:
            try:
                fd = self.bpf.load_func(b"forget_unseen_close", self.bpf.RAW_TRACEPOINT).fd  # once: bcc keeps it
                return run_raw_tracepoint(fd, key.tgid, key.fd & 0xFFFFFFFF, ino) == 1
            except Exception as e:  # OSError from the run; bcc raises plain Exceptions on a load failure
                log.warning("pruned connections are deleted from user space; their process's HTTP "
                            "activity count stays as it is (the kernel would not run forget_unseen_close: %s)", e)
                self._kernel_forgets = False
        try:
            entry = table[key]
            if entry.ino != ino:
                return False
            counted = entry.counted
            del table[key]
        except KeyError:
            return False
        try:  # its HTTP/2 frame walk, if any (bpf/h2_walk.c)
            del self.bpf["h2_walks"][key]
        except KeyError:
            pass
        if counted:
            self._add_used(key.tgid, -1)
        return True
