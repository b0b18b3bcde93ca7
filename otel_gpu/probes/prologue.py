"""Where an entry uprobe goes in a function. x86 uprobes emulate a few instructions
(push, call, jmp, nop, ...) and single-step every other one out of line, which costs two
exceptions: 9.6-10.3 us per call on this project's VMs against 0.73-0.85 us for an
emulated push (bench: a loop probed at each). Code built with CET (-fcf-protection, the
default of Ubuntu's and Fedora's compilers: their Python, OpenSSL, NVIDIA's images)
starts every function with endbr64, which is not emulated. endbr64 changes no register
and no memory, so a probe on the instruction after it sees the same arguments, stack
and return address; it goes there when that instruction is a push (emulated, and never
a jump target: a prologue), else it stays on the entry."""
from __future__ import annotations

import logging

log = logging.getLogger(__name__)

ENDBR64 = b"\xf3\x0f\x1e\xfa"


def entry_skip(path: str, file_offset: int) -> int:
    """Bytes to move a function's entry probe by: 4 past a leading endbr64 followed by a
    push (push %r: 0x50-0x57, or 0x41 0x50-0x57 for r8-r15), else 0 (also when the file
    cannot be read: the probe then goes on the entry, as bcc places it)."""
    try:
        with open(path, "rb") as f:
            f.seek(file_offset)
            head = f.read(6)
    except OSError as e:
        log.debug("cannot read the prologue at %s+0x%x: %s", path, file_offset, e)
        return 0
    if len(head) < 6 or head[:4] != ENDBR64:
        return 0
    push = 0x50 <= head[4] <= 0x57 or (head[4] == 0x41 and 0x50 <= head[5] <= 0x57)
    return len(ENDBR64) if push else 0
