"""Go executables (linux/amd64): which Go built them, and where the running goroutine
is found, for the goroutine probes (bpf/go_probes.c). Stripped binaries too: the
version comes from `.go.buildinfo` (kept by `strip` and `-ldflags=-s -w`), the runtime's
struct offsets from a table per Go version, the TLS slot of `g` from the ELF.

The running goroutine, from any probe on any thread of the process: the thread's TLS
`g` (at FS base + tls_g), then `g.m.curg`. In Go code TLS g is the goroutine itself
(m.curg == g); during a cgo call (a CUDA call from Go) TLS g is the thread's g0 and
m.curg is the goroutine that made the call. Its `goid` names it; `parentGoid` (Go 1.21+)
names the goroutine that started it."""
from __future__ import annotations

import re
import struct
from dataclasses import dataclass
from typing import Optional

from .elf_file import PF_W, PT_LOAD, PT_TLS, ElfFile

BUILDINFO_MAGIC = b"\xff Go buildinf:"
MAX_SCAN = 64 << 20  # bytes of a writable segment searched for the build info


@dataclass(frozen=True)
class GoLayout:
    """Byte offsets in runtime.g and runtime.m (amd64), as the compiler laid them out."""
    g_m: int
    m_curg: int
    g_goid: int
    g_parent_goid: int  # 0: the version has no parentGoid (before 1.21)


# Read from each release's DWARF (a program built with that toolchain) and checked
# against runtime/runtime2.go. 1.23 adds g.syscallbp (+8); 1.25 drops gobuf.ret (-8
# in g, and in m before curg); 1.26 grows the fields between goid and parentGoid.
LAYOUTS: dict[tuple[int, int], GoLayout] = {
    (1, 19): GoLayout(48, 192, 152, 0),
    (1, 20): GoLayout(48, 192, 152, 0),
    (1, 21): GoLayout(48, 192, 152, 272),
    (1, 22): GoLayout(48, 192, 152, 272),
    (1, 23): GoLayout(48, 192, 160, 280),
    (1, 24): GoLayout(48, 192, 160, 280),
    (1, 25): GoLayout(48, 184, 152, 272),
    (1, 26): GoLayout(48, 184, 152, 280),
    (1, 27): GoLayout(48, 184, 152, 280),
}


@dataclass(frozen=True)
class GoBinary:
    version: str              # "go1.27.3"
    layout: Optional[GoLayout]  # None: a Go release this table does not know (not tracked)
    tls_g: Optional[int]      # g's offset from the FS base (negative); None: not known (not tracked)


def release(version: str) -> Optional[tuple[int, int]]:
    """(1, 27) from "go1.27.3", "go1.21rc2", "go1.25.5 X:nocoverageredesign"; None if not a release."""
    m = re.match(r"go(\d+)\.(\d+)", version)
    return (int(m.group(1)), int(m.group(2))) if m else None


def inspect(path: str) -> Optional[GoBinary]:
    """The Go facts of an executable, or None (not an ELF64 Go binary, or unreadable)."""
    try:
        with open(path, "rb") as f:
            elf = ElfFile(f)
            version = _build_version(elf)
            if version is None:
                return None
            return GoBinary(version, LAYOUTS.get(release(version) or (0, 0)), _tls_g_offset(elf))
    except (OSError, struct.error, ValueError):
        return None


def _build_version(elf: ElfFile) -> Optional[str]:
    """runtime.buildVersion, from the build info blob (Go 1.18+: inline strings)."""
    info = elf.sections.get(".go.buildinfo")
    if info is not None:
        blobs = [elf.read(info.offset, min(info.size, 4096))]
    else:  # no section table: the first writable PT_LOAD holds it, 16-byte aligned
        blobs = [elf.read(s.offset, min(s.filesz, MAX_SCAN)) for s in elf.segments
                 if s.type == PT_LOAD and s.flags & PF_W][:1]
    for blob in blobs:
        at = blob.find(BUILDINFO_MAGIC)
        while at >= 0 and at % 16:
            at = blob.find(BUILDINFO_MAGIC, at + 1)
        if at < 0 or len(blob) < at + 33:
            continue
        if not blob[at + 15] & 2:  # pointers to string headers: before Go 1.18, not supported
            return None
        n, used = _uvarint(blob, at + 32)
        text = blob[at + 32 + used: at + 32 + used + n]
        return text.decode(errors="replace") if text.startswith(b"go") else None
    return None


def _tls_g_offset(elf: ElfFile) -> Optional[int]:
    """g's offset from the FS base, or None. The Go linker puts it at -8; with cgo the
    system linker places runtime.tlsg among any C `__thread` data: tlsg's value minus
    the TLS block's size rounded to its alignment (x86-64 variant II). A stripped
    binary whose TLS block holds more than g (C thread-locals) does not say where g
    is: None, never a guess."""
    tls = [s for s in elf.segments if s.type == PT_TLS]
    if not tls:
        return -8
    align = max(tls[0].align, 1)
    block = -(-tls[0].memsz // align) * align
    tlsg = elf.symbol("runtime.tlsg")
    if tlsg is not None:
        return tlsg - block
    return -8 if block == 8 else None


def _uvarint(data: bytes, at: int) -> tuple[int, int]:
    value = shift = used = 0
    while at + used < len(data) and used < 10:
        b = data[at + used]
        used += 1
        value |= (b & 0x7F) << shift
        if not b & 0x80:
            break
        shift += 7
    return value, used
