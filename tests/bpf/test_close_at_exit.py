"""bpf/http_syscalls.c's close program, which a tracked connection's close reaches at the
syscall's exit: by then the fd is released, and the number may already be another file's.
Where another thread's accept took it, the entry under the key is that new connection
(the accept ended the old one as an unseen close), and the close must leave it; where the
process opened anything else there, or nothing, the close ends its own connection. A
tracked connection keeps its socket's inode number (bpf/maps.h fd_ino, the running
kernel's file table at BTF offsets), and the close compares (a file's address would not
do: a closed file's memory can be reused at once).

The accept and close programs run here through BPF_PROG_TEST_RUN, in this process, on the
collector's loaded program: a registers pointer the kernel cannot read makes a call's
arguments read as 0, so the close is of fd 0, and the accept's result (its return value,
the context's second word) is fd 0 too. The test holds fd 0 as it needs."""
from __future__ import annotations

import ctypes as ct
import os
import socket

import pytest

from otel_gpu.kernel_io.program import BpfProgram
from otel_gpu.kernel_io.run_program import run_raw_tracepoint
from otel_gpu.probes import kernel_btf

FD = 0  # the close's fd and the accept's result (above)


@pytest.fixture(scope="module")
def program():
    from otel_gpu.config import DEFAULT_BPF_CACHE
    from otel_gpu.probes.source import ProgramOptions
    from otel_gpu.ratelimit import Stats
    if kernel_btf.fd_table_offsets() is None:
        pytest.skip("no kernel BTF: a close is not checked (bpf/maps.h fd_ino)")
    p = BpfProgram(ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE), Stats())
    p.bpf["traced"][ct.c_uint32(os.getpid())] = ct.c_uint32(1)
    yield p
    p.close()


@pytest.fixture
def stdin_back():
    saved = os.dup(FD)
    yield
    os.dup2(saved, FD)
    os.close(saved)


def _run(program, name: bytes, *args: int) -> None:
    from bcc import BPF
    run_raw_tracepoint(program.bpf.load_func(name, BPF.RAW_TRACEPOINT).fd, *args)


def _accepted_at_fd0(program) -> socket.socket:
    """A connected socket at fd 0, tracked as accept's exit tracks one it returns there."""
    a, b = socket.socketpair()
    os.dup2(a.fileno(), FD)
    a.close()
    _run(program, b"on_accept4", 0, FD)
    assert _tracked(program), "the accept program tracked nothing"
    return b


def _tracked(program) -> bool:
    return any(k.tgid == os.getpid() and k.fd == FD for k in program.bpf["conns"].keys())


def test_a_close_leaves_the_connection_another_threads_accept_holds_there(program, stdin_back):
    peer = _accepted_at_fd0(program)
    _run(program, b"on_close", 0, 0)  # the socket accepted at fd 0 is there: that accept's connection
    assert _tracked(program), "a close ended the connection an accept had taken its number for"
    os.close(FD)
    _run(program, b"on_close", 0, 0)  # released: its own
    assert not _tracked(program), "a close whose fd was released left its connection tracked"
    peer.close()


def _entry(program):
    return next(v for k, v in program.bpf["conns"].items() if k.tgid == os.getpid() and k.fd == FD)


def test_a_close_whose_number_the_process_opened_again_ends_its_connection(program, stdin_back):
    """Ended, and its entry left for the prune: an accept could hold the number (below)."""
    peer = _accepted_at_fd0(program)
    ino = _entry(program).ino
    os.close(FD)
    reopened = os.open(os.devnull, os.O_RDONLY)  # the lowest free number: 0
    assert reopened == FD
    _run(program, b"on_close", 0, 0)
    assert _entry(program).ended == 1, "a close left its connection open because the number was reused"
    _run(program, b"forget_unseen_close", os.getpid(), FD, ino)  # the prune, which lists it
    assert not _tracked(program)
    peer.close()


def test_a_connection_is_ended_once_when_an_accept_takes_its_number_beside_its_close(program, stdin_back):
    """The accept's socket at the number before the close's exit runs, the accept's exit
    after it (another CPU): the close ends the old connection and leaves the entry, the
    accept replaces it, and what the old one held (its share) is given back once."""
    shares = program.bpf["conn_shares"]
    shares[ct.c_uint32(os.getpid())] = shares.Leaf(0, 100)
    try:
        old_peer = _accepted_at_fd0(program)
        a, b = socket.socketpair()
        os.dup2(a.fileno(), FD)  # the accept's socket at the number
        a.close()
        _run(program, b"on_close", 0, 0)
        assert _entry(program).ended == 1
        _run(program, b"on_accept4", 0, FD)  # its exit
        assert _entry(program).ended == 0 and _entry(program).ino == os.fstat(FD).st_ino
        assert shares[ct.c_uint32(os.getpid())].used == 1  # the old given back once, the new counted
        old_peer.close()
        b.close()
    finally:
        del shares[ct.c_uint32(os.getpid())]
        _run(program, b"forget_unseen_close", os.getpid(), FD, os.fstat(FD).st_ino)
