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
            elf = _Elf(f)
            version = elf.build_version()
            if version is None:
                return None
            return GoBinary(version, LAYOUTS.get(release(version) or (0, 0)), elf.tls_g_offset())
    except (OSError, struct.error, ValueError):
        return None


class _Elf:
    """Just enough ELF64 (little-endian, x86-64) for the two questions above."""

    def __init__(self, f) -> None:
        self.f = f
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError("not a little-endian ELF64 file")
        phoff, shoff = struct.unpack_from("<QQ", head, 32)
        phentsize, phnum, shentsize, shnum, shstrndx = struct.unpack_from("<HHHHH", head, 54)
        f.seek(phoff)
        table = f.read(phentsize * min(phnum, 256))
        # (type, flags, offset, vaddr, filesz, memsz, align); p_paddr dropped
        self.segments = [(t, fl, off, va, fsz, msz, al) for t, fl, off, va, _, fsz, msz, al in
                         (struct.unpack_from("<IIQQQQQQ", table, i * phentsize)
                          for i in range(len(table) // max(phentsize, 56)))]
        self.sections = self._sections(shoff, shentsize, shnum, shstrndx)

    def _sections(self, shoff: int, shentsize: int, shnum: int, shstrndx: int) -> dict:
        """name -> (type, offset, size, link, entsize); {} when the file has no section table."""
        if not shoff or not shnum or shentsize < 64 or shnum > 65535:
            return {}
        self.f.seek(shoff)
        raw = self.f.read(shentsize * shnum)
        heads = [struct.unpack_from("<IIQQQQIIQQ", raw, i * shentsize) for i in range(len(raw) // shentsize)]
        if shstrndx >= len(heads):
            return {}
        names = self._read(heads[shstrndx][4], heads[shstrndx][5])
        out = {}
        for name_off, typ, _, _, off, size, link, _, _, entsize in heads:
            end = names.find(b"\0", name_off)
            out[names[name_off:end].decode(errors="replace")] = (typ, off, size, link, entsize)
        return out

    def _read(self, offset: int, size: int) -> bytes:
        self.f.seek(offset)
        return self.f.read(size)

    def build_version(self) -> Optional[str]:
        """runtime.buildVersion, from the build info blob (Go 1.18+: inline strings)."""
        if ".go.buildinfo" in self.sections:
            _, off, size, _, _ = self.sections[".go.buildinfo"]
            blobs = [self._read(off, min(size, 4096))]
        else:  # no section table: the first writable PT_LOAD holds it, 16-byte aligned
            blobs = [self._read(off, min(filesz, MAX_SCAN)) for typ, flags, off, _, filesz, _, _ in self.segments
                     if typ == 1 and flags & 2][:1]
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

    def tls_g_offset(self) -> Optional[int]:
        """g's offset from the FS base, or None. The Go linker puts it at -8; with cgo the
        system linker places runtime.tlsg among any C `__thread` data: tlsg's value minus
        the TLS block's size rounded to its alignment (x86-64 variant II). A stripped
        binary whose TLS block holds more than g (C thread-locals) does not say where g
        is: None, never a guess."""
        tls = [(memsz, align) for typ, _, _, _, _, memsz, align in self.segments if typ == 7]  # PT_TLS
        if not tls:
            return -8
        memsz, align = tls[0]
        block = -(-memsz // max(align, 1)) * max(align, 1)
        tlsg = self._symbol("runtime.tlsg")
        if tlsg is not None:
            return tlsg - block
        return -8 if block == 8 else None

    def _symbol(self, name: str) -> Optional[int]:
        if ".symtab" not in self.sections:
            return None
        _, off, size, _, entsize = self.sections[".symtab"]
        names = self.sections.get(".strtab")
        if names is None or entsize < 24:
            return None
        strings = self._read(names[1], names[2])
        raw = self._read(off, size)
        want = name.encode() + b"\0"
        for i in range(0, len(raw) - 23, entsize):
            name_off, = struct.unpack_from("<I", raw, i)
            if strings[name_off:name_off + len(want)] == want:
                return struct.unpack_from("<Q", raw, i + 8)[0]
        return None


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
