"""bpf/http_syscalls.c on_close, the program a tracked connection's close reaches at the
syscall's exit: by then the fd is released, and another thread's accept may already hold
the same number. The close must end its connection only where the fd is no longer open
(bpf/maps.h fd_open, through the running kernel's file table at BTF offsets), or it would
end the new connection in the old one's place.

The program runs here through BPF_PROG_TEST_RUN, in this process, on the collector's
loaded program: a registers pointer the kernel cannot read makes its arguments read as 0,
so the close is of fd 0, which the test holds open, then closes."""
from __future__ import annotations

import os
import socket

import pytest

from otel_gpu.kernel_io.program import BpfProgram
from otel_gpu.kernel_io.run_program import run_raw_tracepoint
from otel_gpu.probes import kernel_btf

FD = 0  # what the program reads for the close's fd (above)


@pytest.fixture(scope="module")
def program():
    from otel_gpu.config import DEFAULT_BPF_CACHE
    from otel_gpu.probes.source import ProgramOptions
    from otel_gpu.ratelimit import Stats
    if kernel_btf.fd_table_offsets() is None:
        pytest.skip("no kernel BTF: a close is not checked (bpf/maps.h fd_open)")
    p = BpfProgram(ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE), Stats())
    yield p
    p.close()


@pytest.fixture
def fd0_is_a_socket():
    """fd 0 of this process is a connected socket for the test, stdin again after it."""
    saved = os.dup(FD)
    a, b = socket.socketpair()
    os.dup2(a.fileno(), FD)
    try:
        yield
    finally:
        os.dup2(saved, FD)
        os.close(saved)
        a.close()
        b.close()


def _tracked(program) -> bool:
    conns = program.bpf["conns"]
    return any(k.tgid == os.getpid() and k.fd == FD for k in conns.keys())


def test_a_close_ends_its_connection_only_once_the_fd_is_released(program, fd0_is_a_socket):
    from bcc import BPF
    conns = program.bpf["conns"]
    conns[conns.Key(os.getpid(), FD)] = conns.Leaf()
    on_close = program.bpf.load_func(b"on_close", BPF.RAW_TRACEPOINT).fd

    run_raw_tracepoint(on_close, 0, 0)  # fd 0 open: another connection's now (the race)
    assert _tracked(program), "a close whose fd is open again ended the connection on it"

    os.close(FD)
    run_raw_tracepoint(on_close, 0, 0)  # released: this close's own connection
    assert not _tracked(program), "a close whose fd was released left its connection tracked"
