"""probes/kernel_btf.py on a BTF blob built here: member offsets through nested structs,
typedefs and anonymous unions; a missing struct or member is a KeyError. The running
kernel's offsets are checked in the kernel itself: tests/bpf/test_kernel_btf.py."""
from __future__ import annotations

import struct

import pytest

from otel_gpu.probes.kernel_btf import Btf

INT, STRUCT, UNION, TYPEDEF = 1, 4, 5, 8


def _blob() -> bytes:
    strings = b"\0long\0thread_struct\0sp\0fsbase\0thread_t\0pid\0task_struct\0state\0thread\0"
    at = lambda name: strings.index(name.encode() + b"\0")  # noqa: E731
    types = b""
    types += struct.pack("<III", at("long"), INT << 24, 8) + struct.pack("<I", 64)            # [1]
    types += struct.pack("<III", at("thread_struct"), STRUCT << 24 | 2, 16)                     # [2]
    types += struct.pack("<III", at("sp"), 1, 0) + struct.pack("<III", at("fsbase"), 1, 64)
    types += struct.pack("<III", at("thread_t"), TYPEDEF << 24, 2)                              # [3]
    types += struct.pack("<III", 0, UNION << 24 | 1, 8) + struct.pack("<III", at("pid"), 1, 0)  # [4]
    types += struct.pack("<III", at("task_struct"), STRUCT << 24 | 3, 40)                       # [5]
    types += struct.pack("<III", at("state"), 1, 0) + struct.pack("<III", 0, 4, 64) + \
        struct.pack("<III", at("thread"), 3, 128)
    header = struct.pack("<HBBIIIII", 0xEB9F, 1, 0, 24, 0, len(types), len(types), len(strings))
    return header + types + strings


def test_offsets_through_typedefs_and_anonymous_members():
    btf = Btf(_blob())
    assert btf.offset("task_struct", "thread", "fsbase") == 24
    assert btf.offset("task_struct", "pid") == 8  # in an anonymous union
    assert btf.offset("thread_struct", "fsbase") == 8


def test_what_is_not_there():
    btf = Btf(_blob())
    with pytest.raises(KeyError):
        btf.offset("mm_struct", "pgd")
    with pytest.raises(KeyError):
        btf.offset("task_struct", "thread", "gsbase")
    with pytest.raises(ValueError):
        Btf(b"\0" * 24)
