"""kernel_io/connection_table.py prune on the collector's loaded program: a connection
whose close the kernel never saw (close_range, dup2) is forgotten by the kernel
(bpf/http_syscalls.c forget_unseen_close, run through BPF_PROG_TEST_RUN) as a seen close
would be: its process's http_active and share go down with it. Without that, a process
whose pruned connection had served a request counted as in a request for good, and its
CUDA calls streamed one by one outside requests. The process is made up (no such pid):
only the maps are written, as the HTTP probes would have left them."""
from __future__ import annotations

import ctypes as ct
import logging

import pytest

from otel_gpu.kernel_io import connection_table
from otel_gpu.kernel_io.program import BpfProgram

PID = 4_000_000 - 11
SERVED, IDLE, OPEN = 5, 6, 7  # fds: a connection that served a request, one that did not, one still open


@pytest.fixture(scope="module")
def program():
    from otel_gpu.config import DEFAULT_BPF_CACHE
    from otel_gpu.probes.source import ProgramOptions
    from otel_gpu.ratelimit import Stats
    p = BpfProgram(ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE), Stats())
    yield p
    p.close()


def _connections(program) -> None:
    """Three tracked connections of PID, each counted in its share; the one that served
    a request counts in http_active, as the HTTP probes leave it."""
    conns = program.bpf["conns"]
    conns.clear()
    for fd in (SERVED, IDLE, OPEN):
        leaf = conns.Leaf()
        leaf.counted, leaf.requests, leaf.ino = 1, int(fd in (SERVED, OPEN)), 100 + fd
        conns[conns.Key(PID, fd)] = leaf
    program.bpf["http_active"][ct.c_uint32(PID)] = ct.c_int64(2)
    shares = program.bpf["conn_shares"]
    shares[ct.c_uint32(PID)] = shares.Leaf(3, 100)


def _state(program) -> tuple:
    active = program.bpf["http_active"].get(ct.c_uint32(PID))
    return (sorted(k.fd for k in program.bpf["conns"].keys() if k.tgid == PID),
            None if active is None else active.value, program.bpf["conn_shares"][ct.c_uint32(PID)].used)


def _prune_twice(program) -> list:
    """An entry goes when two prunes in a row find its fd is no socket."""
    sockets = lambda pid: {OPEN} if pid == PID else set()  # noqa: E731
    assert program.connections.prune(sockets) == []
    return sorted(program.connections.prune(sockets))


def test_the_kernel_forgets_a_pruned_connection_as_a_seen_close(program):
    _connections(program)
    assert _prune_twice(program) == [(PID, SERVED), (PID, IDLE)]
    assert _state(program) == ([OPEN], 1, 1)  # the open one still counts: in a request, in the share
    assert program.connections._kernel_forgets


@pytest.mark.parametrize("kernel", [True, False], ids=["kernel", "user space"])
def test_a_connection_accepted_on_the_fd_since_the_listing_stays(program, monkeypatch, kernel):
    """Between a prune's listing and its forget, an accept put another socket on the fd
    (another inode): that connection is not the one listed, and stays."""
    monkeypatch.setattr(program.connections, "_kernel_forgets", kernel)
    _connections(program)
    conns = program.bpf["conns"]
    key = conns.Key(PID, IDLE)
    leaf = conns[key]
    listed, leaf.ino = leaf.ino, 999
    conns[key] = leaf
    assert not program.connections._forget_unseen_close(conns, key, listed)
    assert _state(program) == ([SERVED, IDLE, OPEN], 2, 3)
    assert program.connections._forget_unseen_close(conns, key, 999)
    assert _state(program)[0] == [SERVED, OPEN]


def test_where_the_kernel_cannot_run_it_the_entry_goes_from_user_space(program, monkeypatch, caplog):
    """Linux < 5.10 runs no raw tracepoint program from user space: the entries are
    deleted here and their share given back; http_active cannot be written back safely,
    so it stays, and the log says so once."""
    def refused(*_args):
        raise OSError(22, "BPF_PROG_TEST_RUN: Invalid argument")

    monkeypatch.setattr(connection_table, "run_raw_tracepoint", refused)
    monkeypatch.setattr(program.connections, "_kernel_forgets", True)
    _connections(program)
    with caplog.at_level(logging.WARNING, logger=connection_table.__name__):
        assert _prune_twice(program) == [(PID, SERVED), (PID, IDLE)]
    assert _state(program) == ([OPEN], 2, 1)
    assert [r.getMessage() for r in caplog.records if "forget_unseen_close" in r.getMessage()] == [
        "pruned connections are deleted from user space; their process's HTTP activity count stays as it is "
        "(the kernel would not run forget_unseen_close: [Errno 22] BPF_PROG_TEST_RUN: Invalid argument)"]
