"""Where an entry uprobe goes in a function, and whether x86 emulates the instruction
there. x86 uprobes emulate a few instructions (push, call, jmp, nop, ...) and
single-step every other one out of line, which costs two exceptions: 9.6-10.3 us per
call on this project's VMs against 0.73-0.85 us for an emulated push (bench item 15: a
loop probed at each). Code built with CET (-fcf-protection, the
default of Ubuntu's and Fedora's compilers: their Python, OpenSSL, NVIDIA's images)
starts every function with endbr64, and Go starts most with a stack check: neither is
emulated. Both change no argument register, no memory and no stack pointer, so a probe
on the push that follows sees the same arguments, stack and return address; it goes
there (skip()), else it stays on the entry."""
from __future__ import annotations

import logging
from typing import Optional

log = logging.getLogger(__name__)

ENDBR64 = b"\xf3\x0f\x1e\xfa"


def entry_code(path: str, symbol: str = "", addr: Optional[int] = None, size: int = 24) -> bytes:
    """The first `size` bytes of a function, named by its symbol or address (bcc resolves
    either to its file offset); b"" when it cannot be read (then nothing is claimed)."""
    from bcc import BPF
    try:
        _, offset = BPF._check_path_symbol(path.encode(), symbol.encode(), addr, -1)
    except Exception as e:  # bcc raises a plain Exception for a symbol it cannot resolve
        log.debug("cannot find the entry of %s in %s: %s", symbol or hex(addr or 0), path, e)
        return b""
    return _read(path, offset, size)


def entry_skip(path: str, file_offset: int) -> int:
    """Bytes to move a function's entry probe by (skip()), reading the file; 0 when it
    cannot be read (the probe then goes on the entry, as bcc places it)."""
    return skip(_read(path, file_offset, HEAD))


def _read(path: str, offset: int, size: int) -> bytes:
    try:
        with open(path, "rb") as f:
            f.seek(offset)
            return f.read(size)
    except OSError as e:
        log.debug("cannot read the prologue at %s+0x%x: %s", path, offset, e)
        return b""


def skip(code: bytes) -> int:
    """Bytes to move an entry probe by, from the function's first bytes, to a push (which
    x86 emulates) reached before any argument register or the stack is changed:
    - past a leading endbr64 (CET builds): it changes no register and no memory;
    - past a Go function's stack check, `[lea -N(%rsp),%r12;] cmp 0x10(%r14),%rsp|%r12;
      jbe morestack`: it writes only flags (and r12, never an argument register of Go's
      ABI: RAX, RBX, RCX, RDI, RSI, R8-R11), and the growth path jumps back to the entry,
      so a probe on the push after it sees each call once, its arguments as at the entry.
    0 otherwise: the probe stays on the entry."""
    if code[:4] == ENDBR64:
        return len(ENDBR64) if _push(code[4:]) else 0
    at = 0
    if code[:4] == b"\x4c\x8d\x64\x24":    # lea disp8(%rsp),%r12
        at = 5
    elif code[:4] == b"\x4c\x8d\xa4\x24":  # lea disp32(%rsp),%r12
        at = 8
    if code[at:at + 4] != (b"\x4d\x3b\x66\x10" if at else b"\x49\x3b\x66\x10"):  # cmp 0x10(%r14),%r12|%rsp
        return 0
    at += 4
    if code[at:at + 1] == b"\x76":                    # jbe rel8
        at += 2
    elif code[at:at + 2] == b"\x0f\x86":             # jbe rel32
        at += 6
    else:
        return 0
    return at if _push(code[at:]) else 0


HEAD = 24  # bytes of a function's start that skip() reads


SINGLE_STEP_COST = "~10 us a call on VMs, ~5 us on a bare host (bench item 15)"


def _push(code: bytes) -> bool:
    """`code` starts with push %r (0x50-0x57, or 0x41 0x50-0x57 for r8-r15)."""
    if not code:
        return False
    return 0x50 <= code[0] <= 0x57 or (code[0] == 0x41 and len(code) >= 2 and 0x50 <= code[1] <= 0x57)


def emulated(code: bytes) -> bool:
    """Whether an entry probe on the function starting with `code` (its first bytes) hits
    an instruction x86 uprobes emulate, where skip() places it: a push, a call or jmp
    rel32/rel8, a one-byte nop. b"" (not read): True, nothing claimed."""
    if not code:
        return True
    at = skip(code)
    return _push(code[at:]) or (code[at:at + 1] in (b"\xe8", b"\xe9", b"\xeb", b"\x90"))


def tail_call(code: bytes) -> int | None:
    """Where the function starting with `code` calls, when it is `[endbr64] sub $imm8,%rsp;
    call rel32` (nothing touches an argument register before the call, so the callee
    gets the function's own arguments): the callee's offset from the function's start."""
    at = len(ENDBR64) if code[:4] == ENDBR64 else 0
    if code[at:at + 3] != b"\x48\x83\xec" or code[at + 4:at + 5] != b"\xe8" or len(code) < at + 9:
        return None
    return at + 9 + int.from_bytes(code[at + 5:at + 9], "little", signed=True)


def calls(code: bytes, target: int) -> bool:
    """Whether `code`, a function's first bytes, holds a call rel32 to offset `target`
    (from the function's start). A byte scan, not a decode: used to confirm a call the
    caller already knows of, never to find one."""
    return any(code[i] == 0xE8 and i + 5 + int.from_bytes(code[i + 1:i + 5], "little", signed=True) == target
               for i in range(len(code) - 4))
