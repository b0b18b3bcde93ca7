"""probes/syscalls.py against bpf/http_syscalls.c and the system's own syscall numbers:
a program the table names that the C lacks would fail the load; a C program the table
misses would never run; a wrong number would hand one syscall's arguments to another's
program."""
import re
from pathlib import Path

import pytest

from otel_gpu.probes.source import bpf_dir
from otel_gpu.probes.syscalls import ARRAY, SYSCALL_NUMBERS, programs

UNISTD = Path("/usr/include/x86_64-linux-gnu/asm/unistd_64.h")


def test_the_table_names_exactly_the_programs_the_c_defines():
    text = (bpf_dir() / "http_syscalls.c").read_text()
    defined = {f"on_{name}" for name in re.findall(r"^ON\((\w+)\)", text, re.M)}
    assert {fn for fn, _ in programs()} == defined
    slots = int(re.search(r"#define SYSCALL_SLOTS (\d+)", text).group(1))
    assert all(0 <= nr < slots for _, nr in programs())
    assert re.findall(r"BPF_PROG_ARRAY\((\w+), SYSCALL_SLOTS\)", text) == [ARRAY]


def test_the_numbers_are_the_systems():
    if not UNISTD.exists():
        pytest.skip(f"{UNISTD}: not here (linux-libc-dev)")
    system = dict(re.findall(r"#define __NR_(\w+) (\d+)", UNISTD.read_text()))
    assert {name: int(system[name]) for name in SYSCALL_NUMBERS} == SYSCALL_NUMBERS
