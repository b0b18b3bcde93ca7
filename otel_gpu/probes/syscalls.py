"""The syscalls bpf/http_syscalls.c follows, by their x86-64 numbers.

One raw tracepoint (raw_syscalls' sys_exit) sees every syscall on the host, at its exit;
for a traced process it tail-calls the program for the syscall's number, `on_<name>`,
from the program array `sys_exits`. `install` fills it as the program loads: before it,
a traced process's syscalls would reach no program, so it runs before any process is
traced."""
from __future__ import annotations

import ctypes as ct

# x86-64's numbers (arch/x86/entry/syscalls/syscall_64.tbl: never renumbered).
SYSCALL_NUMBERS: dict[str, int] = {
    "read": 0, "write": 1, "close": 3, "readv": 19, "writev": 20, "accept": 43, "sendto": 44,
    "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "accept4": 288,
}
ARRAY = "sys_exits"


def programs() -> list[tuple[str, int]]:
    """(function, slot in ARRAY) for each syscall followed."""
    return [(f"on_{name}", nr) for name, nr in SYSCALL_NUMBERS.items()]


def install(bpf) -> None:
    """Each program verified (side by side, where the program came from the cache) and
    put in its array at the syscall's number."""
    from bcc import BPF  # imported late: the unit tier runs without bcc

    from .cached_bpf import load_ahead
    table = programs()
    load_ahead(bpf, [fn for fn, _ in table], BPF.RAW_TRACEPOINT)
    for fn, nr in table:
        bpf[ARRAY][ct.c_int(nr)] = ct.c_int(bpf.load_func(fn.encode(), BPF.RAW_TRACEPOINT).fd)
