"""The syscalls bpf/http_syscalls.c follows, by their x86-64 numbers.

Two raw tracepoints (raw_syscalls' sys_enter and sys_exit) see every syscall on the
host; for a traced process they tail-call the program for the syscall's number and
phase, `on_enter_<name>` / `on_exit_<name>`, from the program arrays `sys_enters` /
`sys_exits`. `install` fills those as the program loads: before it, a traced process's
syscalls would reach no program, so it runs before any process is traced."""
from __future__ import annotations

import ctypes as ct

# x86-64's numbers (arch/x86/entry/syscalls/syscall_64.tbl: never renumbered).
SYSCALL_NUMBERS: dict[str, int] = {
    "read": 0, "write": 1, "close": 3, "readv": 19, "writev": 20, "accept": 43, "sendto": 44,
    "recvfrom": 45, "sendmsg": 46, "recvmsg": 47, "accept4": 288,
}
ENTER_ONLY = frozenset({"close"})  # a tracked connection ends at the call; its result does not matter
ARRAYS = {"enter": "sys_enters", "exit": "sys_exits"}


def followed() -> list[tuple[str, str]]:
    """(syscall, phase) for each program: both phases of each syscall, close's entry only."""
    return [(name, phase) for name in SYSCALL_NUMBERS for phase in ARRAYS
            if phase == "enter" or name not in ENTER_ONLY]


def programs() -> list[tuple[str, str, int]]:
    """(program array, function, slot) for each syscall and phase followed."""
    return [(ARRAYS[phase], f"on_{phase}_{name}", SYSCALL_NUMBERS[name]) for name, phase in followed()]


def install(bpf) -> None:
    """Each program verified (side by side, where the program came from the cache) and
    put in its array at the syscall's number."""
    from bcc import BPF  # imported late: the unit tier runs without bcc

    from .cached_bpf import load_ahead
    table = programs()
    load_ahead(bpf, [fn for _, fn, _ in table], BPF.RAW_TRACEPOINT)
    for array, fn, nr in table:
        bpf[array][ct.c_int(nr)] = ct.c_int(bpf.load_func(fn.encode(), BPF.RAW_TRACEPOINT).fd)
