"""Where OpenSSL's reads and writes are probed: at the one internal function each goes
through, when the file proves it, instead of at its public entries.

Debian's libssl (3.x, built without CET) starts SSL_read, SSL_write and their _ex forms
with `sub $imm,%rsp`, which x86 uprobes single-step (prologue.py: ~10 us a call on VMs,
+144 us an HTTPS request measured). Each pair calls one internal function
(ssl_read_internal, ssl_write_internal in OpenSSL 1.1.1 and 3.x) that starts with a
push, which they emulate. The proof, from the file's own code:
  - SSL_read_ex is `[endbr64] sub $imm8,%rsp; call T`: nothing between its entry and the
    call touches an argument register, so T takes SSL_read_ex's (ssl, buf, num,
    &readbytes) and returns its result: T has the _ex convention;
  - SSL_read calls T too (a call rel32 to T among its first bytes), so one probe on T
    sees every SSL_read and SSL_read_ex, once;
  - T's entry is emulated (prologue.emulated).
Likewise SSL_write_ex, SSL_write and their T. Where any of it does not hold (another
build, another library), the public entries are probed as before, and the attach log
names those that are single-stepped (probes/attacher.py)."""
from __future__ import annotations

import logging
from typing import Optional

from .rows import TLS_INTERNAL_PROBES
from .elf_file import ElfFile
from .prologue import calls, emulated, tail_call

log = logging.getLogger(__name__)

READ, WRITE = (r.symbol for r in TLS_INTERNAL_PROBES)  # the rows probed at the two functions found
THROUGH = ((READ, "SSL_read_ex", "SSL_read"), (WRITE, "SSL_write_ex", "SSL_write"))
HEAD = 96  # bytes of a function's start read


def internal_entries(path: str) -> tuple:
    """((READ, address), (WRITE, address)) where `path` proves both (module docstring),
    else ()."""
    try:
        with open(path, "rb") as f:
            elf = ElfFile(f)
            found = tuple((name, _through(elf, ex, plain)) for name, ex, plain in THROUGH)
    except (OSError, ValueError) as e:
        log.debug("%s: cannot read its SSL functions: %s", path, e)
        return ()
    if any(addr is None for _, addr in found):
        log.debug("%s: SSL_read/SSL_write do not go through a function the probes can take", path)
        return ()
    return found


def _through(elf: ElfFile, ex: str, plain: str) -> Optional[int]:
    ex_at, ex_code = _head(elf, elf.symbol(ex))
    off = tail_call(ex_code) if ex_code else None
    if off is None:
        return None
    target = ex_at + off
    _, target_code = _head(elf, target)
    plain_at, plain_code = _head(elf, elf.symbol(plain))
    if not target_code or not emulated(target_code) or not plain_code or not calls(plain_code, target - plain_at):
        return None
    return target


def _head(elf: ElfFile, vaddr: Optional[int]) -> tuple:
    """(vaddr, the first HEAD bytes of the function there), or (vaddr, b"")."""
    offset = elf.file_offset(vaddr) if vaddr else None
    return vaddr, (elf.read(offset, HEAD) if offset is not None else b"")
