"""probes/kernel_btf.py against the running kernel: the offsets it reads from BTF are
where a BPF program finds the values. A program on getppid() reads the calling task's
tgid and thread.fsbase at those offsets; they must be this process's pid and its FS
base (arch_prctl(ARCH_GET_FS))."""
from __future__ import annotations

import ctypes as ct
import os

from otel_gpu.probes.kernel_btf import Btf, task_fsbase_offset

ARCH_GET_FS, SYS_ARCH_PRCTL, SYS_GETPPID = 0x1003, 158, 110

PROGRAM = r"""
BPF_ARRAY(seen, u64, 2);
TRACEPOINT_PROBE(syscalls, sys_enter_getppid) {
    if ((bpf_get_current_pid_tgid() >> 32) != WANT_TGID)
        return 0;
    void *task = (void *)bpf_get_current_task();
    u64 tgid = 0, fsbase = 0;
    bpf_probe_read_kernel(&tgid, 4, task + TGID_OFFSET);
    bpf_probe_read_kernel(&fsbase, 8, task + FSBASE_OFFSET);
    int zero = 0, one = 1;
    seen.update(&zero, &tgid);
    seen.update(&one, &fsbase);
    return 0;
}
"""


def test_btf_offsets_are_where_the_kernel_keeps_the_values():
    from bcc import BPF

    from otel_gpu.probes.source import kernel_headers_hint
    kernel_headers_hint()  # bcc needs the header tree setup merged
    fsbase_off = task_fsbase_offset()
    assert fsbase_off is not None
    tgid_off = Btf.running().offset("task_struct", "tgid")
    b = BPF(text=PROGRAM, cflags=[f"-DWANT_TGID={os.getpid()}", f"-DTGID_OFFSET={tgid_off}",
                                  f"-DFSBASE_OFFSET={fsbase_off}"])
    try:
        libc = ct.CDLL(None, use_errno=True)
        fs = ct.c_uint64()
        assert libc.syscall(SYS_ARCH_PRCTL, ARCH_GET_FS, ct.byref(fs)) == 0
        libc.syscall(SYS_GETPPID)
        seen = b["seen"]
        assert seen[ct.c_int(0)].value == os.getpid()
        assert seen[ct.c_int(1)].value == fs.value != 0
    finally:
        b.cleanup()
