"""Mends a mismatch between Debian's bcc Python bindings and libbcc (0.26).

libbcc's `bpf_attach_uprobe` takes seven arguments, the last a uint32
`ref_ctr_offset` (the USDT semaphore of a probe); the Python bindings declare six
and call it with six. The seventh is then whatever lies on the stack, so every
uprobe bcc registers here carries a garbage reference-counter offset (0x6,
measured). The kernel keeps one offset per (inode, offset): a second tool's
uprobe on the same function (bpftrace, another agent) fails with `ref_ctr_offset
mismatch` in the kernel log, in whichever order the two attach; and a non-zero
offset makes the kernel increment a counter at that file offset in the memory of
every process that maps the library. `apply()` declares the seventh argument and
passes 0, what the bindings meant."""
from __future__ import annotations

import ctypes as ct
import logging

log = logging.getLogger(__name__)

_ARGS_WITH_REF_CTR = 7


class _LibWithUprobeFix:
    """Forwards everything to libbcc; `bpf_attach_uprobe` gets ref_ctr_offset=0."""

    def __init__(self, lib, attach_uprobe) -> None:
        self._lib = lib
        self._attach_uprobe = attach_uprobe

    def __getattr__(self, name):
        return getattr(self._lib, name)

    def bpf_attach_uprobe(self, *args):
        if len(args) == _ARGS_WITH_REF_CTR - 1:
            args = (*args, 0)
        return self._attach_uprobe(*args)


def apply() -> bool:
    """Idempotent. True when the bindings needed the fix (and now have it)."""
    import bcc
    from bcc import libbcc

    if isinstance(bcc.lib, _LibWithUprobeFix):
        return True
    attach = libbcc.lib.bpf_attach_uprobe
    if attach.argtypes is None or len(attach.argtypes) >= _ARGS_WITH_REF_CTR:
        return False  # bindings that already pass ref_ctr_offset
    attach.argtypes = [*attach.argtypes, ct.c_uint32]
    bcc.lib = _LibWithUprobeFix(libbcc.lib, attach)
    log.debug("bcc: bpf_attach_uprobe now passes ref_ctr_offset=0")
    return True
