"""uprobe_multi links (kernel 6.6+): one BPF_LINK_CREATE attaches one program to many
offsets of one file, for every process or for one (a pointer compare in the kernel,
no lock). Closing the link's descriptor detaches every offset at once, with one grace
period (6.12+), where a perf-event uprobe pays ~0.1-0.25 s per probe.

bcc 0.26 has no wrapper: this is the raw bpf(2) call, laid out as in the kernel's
include/uapi/linux/bpf.h. A program attached here must be loaded as KPROBE with
expected_attach_type BPF_TRACE_UPROBE_MULTI (load_program)."""
from __future__ import annotations

import ctypes as ct
import errno
import os
import struct
from typing import Optional, Sequence

from .elf_file import ElfFile

SYS_BPF = 321  # x86-64 (the probes are x86-64 only: bpf/cuda_probes.c's ABI notes)
BPF_PROG_LOAD, BPF_LINK_CREATE = 5, 28
BPF_PROG_TYPE_KPROBE = 2
BPF_TRACE_UPROBE_MULTI = 48
BPF_F_UPROBE_MULTI_RETURN = 1
LOG_SIZE = 1 << 16  # verifier log kept when a load fails
# The verifier gives up with EAGAIN when a signal is pending: tried again, as libbpf
# does (5 attempts) for the programs bcc loads.
LOAD_ATTEMPTS = 5

_libc = ct.CDLL(None, use_errno=True)
_libc.syscall.restype = ct.c_long


class _ProgLoad(ct.Structure):  # the BPF_PROG_LOAD head of union bpf_attr
    _fields_ = [("prog_type", ct.c_uint32), ("insn_cnt", ct.c_uint32), ("insns", ct.c_uint64),
                ("license", ct.c_uint64), ("log_level", ct.c_uint32), ("log_size", ct.c_uint32),
                ("log_buf", ct.c_uint64), ("kern_version", ct.c_uint32), ("prog_flags", ct.c_uint32),
                ("prog_name", ct.c_char * 16), ("prog_ifindex", ct.c_uint32),
                ("expected_attach_type", ct.c_uint32)]


class _LinkCreate(ct.Structure):  # the BPF_LINK_CREATE head of union bpf_attr, uprobe_multi member
    _fields_ = [("prog_fd", ct.c_uint32), ("target_fd", ct.c_uint32), ("attach_type", ct.c_uint32),
                ("flags", ct.c_uint32), ("path", ct.c_uint64), ("offsets", ct.c_uint64),
                ("ref_ctr_offsets", ct.c_uint64), ("cookies", ct.c_uint64), ("cnt", ct.c_uint32),
                ("multi_flags", ct.c_uint32), ("pid", ct.c_uint32), ("_pad", ct.c_uint32)]


def _bpf(cmd: int, attr: ct.Structure) -> int:
    ret = _libc.syscall(SYS_BPF, cmd, ct.byref(attr), ct.sizeof(attr))
    if ret < 0:
        err = ct.get_errno()
        raise OSError(err, os.strerror(err))
    return ret


def load_program(name: bytes, insns: bytes, license: bytes) -> int:
    """A KPROBE program that uprobe_multi links can run; its descriptor. Raises
    OSError with the verifier's log on refusal."""
    log = ct.create_string_buffer(LOG_SIZE)
    code = ct.create_string_buffer(insns, len(insns))
    lic = ct.create_string_buffer(license)
    attr = _ProgLoad(prog_type=BPF_PROG_TYPE_KPROBE, insn_cnt=len(insns) // 8,
                     insns=ct.addressof(code), license=ct.addressof(lic),
                     prog_name=name[:15], expected_attach_type=BPF_TRACE_UPROBE_MULTI)
    try:
        return _prog_load(attr)
    except OSError as e:
        # Load again with the log only on refusal: a log costs the verifier time.
        attr.log_level, attr.log_size, attr.log_buf = 1, LOG_SIZE, ct.addressof(log)
        try:
            return _prog_load(attr)
        except OSError:
            raise OSError(e.errno, f"{e.strerror}: {log.value.decode(errors='replace')[-2000:]}") from None


def _prog_load(attr: _ProgLoad) -> int:
    attempts = LOAD_ATTEMPTS
    while True:
        try:
            return _bpf(BPF_PROG_LOAD, attr)
        except OSError as e:
            attempts -= 1
            if e.errno != errno.EAGAIN or not attempts:
                raise


def attach(prog_fd: int, path: str, offsets: Sequence[int], ret: bool = False, pid: Optional[int] = None) -> int:
    """One link running `prog_fd` at each file offset of `path` (at return with `ret`),
    in every process or in `pid` only; its descriptor (closing it detaches)."""
    n = len(offsets)
    offs = (ct.c_ulong * n)(*offsets)
    p = ct.create_string_buffer(os.fsencode(path))
    attr = _LinkCreate(prog_fd=prog_fd, attach_type=BPF_TRACE_UPROBE_MULTI, path=ct.addressof(p),
                       offsets=ct.addressof(offs), cnt=n,
                       multi_flags=BPF_F_UPROBE_MULTI_RETURN if ret else 0, pid=pid or 0)
    return _bpf(BPF_LINK_CREATE, attr)


# mov r0, 0; exit: what the support check loads and links.
_RETURN_ZERO = bytes.fromhex("b700000000000000" "9500000000000000")


def supported() -> tuple[bool, str]:
    """(True, "") where this kernel and our privileges make uprobe_multi links, else
    (False, why). The check links a program that does nothing to the entry point of
    this process's own executable, for this process only (code that never runs
    again), and closes it."""
    exe = os.readlink("/proc/self/exe")
    offset = _entry_offset(exe)
    if offset is None:
        return False, f"no entry point found in {exe}"
    try:
        prog = load_program(b"multi_check", _RETURN_ZERO, b"GPL")
    except OSError as e:
        return False, f"program load refused: {e.strerror}"
    try:
        os.close(attach(prog, exe, [offset], pid=os.getpid()))
        return True, ""
    except OSError as e:
        return False, f"link refused: {e.strerror}"
    finally:
        os.close(prog)


def _entry_offset(path: str) -> Optional[int]:
    """The file offset of an ELF64 executable's entry point, or None."""
    try:
        with open(path, "rb") as f:
            elf = ElfFile(f)
            return elf.file_offset(elf.entry)
    except (OSError, struct.error, ValueError):
        return None
