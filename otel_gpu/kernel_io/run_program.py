"""Runs a loaded BPF program once from user space (BPF_PROG_TEST_RUN, Linux >= 5.10 for
raw tracepoint programs) through libbpf's bpf_prog_test_run_opts: for work that must be
atomic with the probes' own map updates (kernel_io/connection_table.py prune)."""
from __future__ import annotations

import ctypes as ct
import ctypes.util
import os
from functools import lru_cache


class _TestRunOpts(ct.Structure):  # libbpf's struct bpf_test_run_opts (libbpf 1.x)
    _fields_ = [("sz", ct.c_size_t), ("data_in", ct.c_void_p), ("data_out", ct.c_void_p),
                ("data_size_in", ct.c_uint32), ("data_size_out", ct.c_uint32),
                ("ctx_in", ct.c_void_p), ("ctx_out", ct.c_void_p),
                ("ctx_size_in", ct.c_uint32), ("ctx_size_out", ct.c_uint32),
                ("retval", ct.c_uint32), ("repeat", ct.c_int), ("duration", ct.c_uint32),
                ("flags", ct.c_uint32), ("cpu", ct.c_uint32), ("batch_size", ct.c_uint32)]


@lru_cache(maxsize=1)
def _libbpf():
    name = ctypes.util.find_library("bpf")  # libbpf.so.1: bcc's libbcc links it
    if name is None:
        raise OSError("libbpf not found")
    lib = ct.CDLL(name, use_errno=True)
    lib.bpf_prog_test_run_opts.argtypes = [ct.c_int, ct.POINTER(_TestRunOpts)]
    lib.bpf_prog_test_run_opts.restype = ct.c_int
    return lib


def run_raw_tracepoint(prog_fd: int, *args: int) -> int:
    """Runs a raw tracepoint program with ctx->args = `args` (u64 each); its return
    value. OSError where the kernel or libbpf refuses."""
    ctx = (ct.c_uint64 * len(args))(*args)
    opts = _TestRunOpts(sz=ct.sizeof(_TestRunOpts), ctx_in=ct.cast(ctx, ct.c_void_p), ctx_size_in=ct.sizeof(ctx))
    res = _libbpf().bpf_prog_test_run_opts(prog_fd, ct.byref(opts))
    if res != 0:
        err = -res if res < 0 else ct.get_errno()
        raise OSError(err, f"BPF_PROG_TEST_RUN: {os.strerror(err)}")
    return opts.retval
