"""Just enough of an ELF64 little-endian file (x86-64 executables and libraries) for the
probes' questions: its entry point, program headers, section headers and symbols,
each read from the open file as asked. Used for DT_INIT (elf_init.py), the entry point
the uprobe_multi check links to (uprobe_multi.py), Go's build info and TLS slot
(go_runtime.py) and CPython's version and runtime state (python.py). Anything else
raises ValueError at construction."""
from __future__ import annotations

import struct
from dataclasses import dataclass
from typing import BinaryIO, Optional

PT_LOAD, PT_DYNAMIC, PT_TLS = 1, 2, 7
PF_W = 2
MAX_PHNUM = 256  # a real file has a dozen
# (symbol table, its string table): static first; a stripped file keeps only the exported.
SYMBOL_TABLES = ((".symtab", ".strtab"), (".dynsym", ".dynstr"))
_SYM = struct.Struct("<IBBHQQ")  # Elf64_Sym: name, info, other, shndx, value, size


@dataclass(frozen=True)
class Segment:
    type: int
    flags: int
    offset: int
    vaddr: int
    filesz: int
    memsz: int
    align: int


@dataclass(frozen=True)
class Section:
    type: int
    addr: int
    offset: int
    size: int
    entsize: int


class ElfFile:
    def __init__(self, f: BinaryIO) -> None:
        self.f = f
        head = f.read(64)
        if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
            raise ValueError("not a little-endian ELF64 file")
        self.entry, phoff, self._shoff = struct.unpack_from("<QQQ", head, 24)
        phentsize, phnum, self._shentsize, self._shnum, self._shstrndx = struct.unpack_from("<HHHHH", head, 54)
        if phentsize < 56 or phnum > MAX_PHNUM:
            raise ValueError("implausible program header table")
        table = self.read(phoff, phentsize * phnum)
        self.segments = [Segment(t, fl, off, va, fsz, msz, al) for t, fl, off, va, _, fsz, msz, al in
                         (struct.unpack_from("<IIQQQQQQ", table, i * phentsize)
                          for i in range(len(table) // phentsize))]
        self._sections: Optional[dict] = None

    def read(self, offset: int, size: int) -> bytes:
        self.f.seek(offset)
        return self.f.read(size)

    def file_offset(self, vaddr: int) -> Optional[int]:
        """Where in the file the loaded address `vaddr` comes from; None outside every PT_LOAD."""
        for s in self.segments:
            if s.type == PT_LOAD and s.vaddr <= vaddr < s.vaddr + s.filesz:
                return vaddr - s.vaddr + s.offset
        return None

    @property
    def sections(self) -> dict:
        """name -> Section; {} when the file has no section table (stripped of it)."""
        if self._sections is None:
            self._sections = self._read_sections()
        return self._sections

    def _read_sections(self) -> dict:
        n, size = self._shnum, self._shentsize
        if not self._shoff or not n or size < 64:
            return {}
        raw = self.read(self._shoff, size * n)
        heads = [struct.unpack_from("<IIQQQQIIQQ", raw, i * size) for i in range(len(raw) // size)]
        if self._shstrndx >= len(heads):
            return {}
        names = self.read(heads[self._shstrndx][4], heads[self._shstrndx][5])
        out = {}
        for name_off, typ, _, addr, off, sz, _, _, _, entsize in heads:
            end = names.find(b"\0", name_off)
            out[names[name_off:end].decode(errors="replace")] = Section(typ, addr, off, sz, entsize)
        return out

    def symbol(self, name: str) -> Optional[int]:
        """The value of a symbol: static (.symtab) first, else exported (.dynsym: what a
        stripped file keeps); None when neither has it."""
        want = name.encode() + b"\0"
        for table, names in SYMBOL_TABLES:
            found = self.symbol_entries(table, names)
            if found is None:
                continue
            strings_at, entries = found
            strings = self.read(strings_at, self.sections[names].size)
            for name_off, _, _, shndx, value, _ in entries:
                if shndx and strings[name_off:name_off + len(want)] == want:  # defined here, not imported
                    return value
        return None

    def symbol_entries(self, table: str, names: str) -> Optional[tuple]:
        """(file offset of `names`, the string table, and the entries of `table` as
        (name offset, info, other, shndx, value, size)); None where the file lacks either."""
        symtab, strtab = self.sections.get(table), self.sections.get(names)
        if symtab is None or strtab is None or symtab.entsize != _SYM.size:
            return None
        raw = self.read(symtab.offset, symtab.size)
        return strtab.offset, _SYM.iter_unpack(raw[:len(raw) - len(raw) % _SYM.size])

    def load_vaddr(self) -> Optional[int]:
        """The address the first loadable segment asks for, less its file offset: the
        process maps the file's offset 0 at this address plus the load bias."""
        loads = [s for s in self.segments if s.type == PT_LOAD]
        return loads[0].vaddr - loads[0].offset if loads else None
