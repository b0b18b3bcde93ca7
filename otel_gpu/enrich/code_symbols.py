"""A code address of a live process -> the name of the function there: the module
mapping it (/proc/<pid>/maps), the address's file offset, the ELF symbol covering it
(.symtab, else .dynsym). What a runtime launch's host stub is called; or, for HIP, the
kernel handle object hipcc emits under the kernel's mangled name (a data symbol).

Our own reader, not bcc's symbolizer: bcc 0.26's (ProcSyms) closes a descriptor it
never opened each time it reads a process's modules (an uninitialised member of the
perf-map path it tries). Traced on a CI run: close() of garbage numbers from
ProcSyms::_add_module; where the garbage is a descriptor of ours, a map or a probe of
the collector is closed behind its back (seen: a tracepoint's, at shutdown)."""
from __future__ import annotations

import bisect
import logging
import os
import struct
from array import array
from collections import OrderedDict
from typing import BinaryIO, Optional

from ..probes.elf_file import PT_LOAD, SYMBOL_TABLES, ElfFile

log = logging.getLogger(__name__)

MAX_FILES = 32        # symbol tables kept (least recently used dropped): a process maps a few CUDA modules
MAX_NAME = 4096       # bytes read for one name (mangled C++ templates run long)
WALK_BACK = 8         # symbols stepped back over from the nearest start (nested or zero-sized ones)
STT_OBJECT, STT_FUNC, STT_GNU_IFUNC = 1, 2, 10
# What a launch's func may point at: a function (a CUDA host stub), or a HIP kernel handle,
# which LLVM 13+ emits as an object named with the kernel's mangled name.
NAMED_TYPES = (STT_OBJECT, STT_FUNC, STT_GNU_IFUNC)


class FileSymbols:
    """The function and object symbols of one ELF file, sorted by address: three arrays,
    names read from the file when asked (a libtorch has hundreds of thousands)."""

    def __init__(self, elf: ElfFile) -> None:
        self.loads = [(s.offset, s.filesz, s.vaddr) for s in elf.segments if s.type == PT_LOAD]
        self.strtabs: list[int] = []  # file offset of each table's strings
        starts, sizes, names = array("Q"), array("Q"), array("Q")  # names: table << 32 | offset
        for symtab_name, strtab_name in SYMBOL_TABLES:  # both read: names from either
            found = elf.symbol_entries(symtab_name, strtab_name)
            if found is None:
                continue
            table = len(self.strtabs) << 32
            strings_at, entries = found
            self.strtabs.append(strings_at)
            for name, info, _, shndx, value, size in entries:
                if shndx and value and name and info & 0xF in NAMED_TYPES:
                    starts.append(value)
                    sizes.append(size)
                    names.append(table | name)
        order = sorted(range(len(starts)), key=starts.__getitem__)  # stable: .symtab's name first among aliases
        self.starts = array("Q", (starts[i] for i in order))
        self.sizes = array("Q", (sizes[i] for i in order))
        self.names = array("Q", (names[i] for i in order))

    def vaddr(self, file_offset: int) -> Optional[int]:
        for offset, filesz, vaddr in self.loads:
            if offset <= file_offset < offset + filesz:
                return vaddr + file_offset - offset
        return None

    def name_at(self, vaddr: int, f: BinaryIO) -> Optional[str]:
        """The function covering `vaddr` (a symbol of size 0: only its own address),
        its name read from `f`."""
        i = bisect.bisect_right(self.starts, vaddr) - 1
        for j in range(i, max(i - WALK_BACK, -1), -1):
            start, size = self.starts[j], self.sizes[j]
            if start == vaddr or start <= vaddr < start + size:
                ref = self.names[j]
                f.seek(self.strtabs[ref >> 32] + (ref & 0xFFFFFFFF))
                raw = f.read(MAX_NAME)
                end = raw.find(b"\0")
                return raw[:end if end >= 0 else len(raw)].decode(errors="replace") or None
        return None


class CodeSymbols:
    """Names code addresses of live processes. Per process its readable mappings,
    read again when an address is in none of them (a module loaded since); per file
    (device, inode, size, mtime) its symbols, MAX_FILES at most."""

    def __init__(self, proc_root: str = "/proc", max_files: int = MAX_FILES) -> None:
        self.proc_root = proc_root
        self.max_files = max_files
        self._maps: dict[int, list[tuple[int, int, int, str]]] = {}  # pid -> (start, end, offset, path)
        self._files: OrderedDict[tuple, Optional[FileSymbols]] = OrderedDict()

    def name(self, pid: int, addr: int) -> Optional[str]:
        """The raw (mangled) symbol name of the function at `addr` in process `pid`;
        None when no mapped file's symbols cover it, or the process is gone."""
        mapping = self._mapping(pid, addr, self._maps.get(pid))
        if mapping is None:
            self._maps[pid] = self._read_maps(pid)
            mapping = self._mapping(pid, addr, self._maps[pid])
        if mapping is None:
            return None
        start, end, offset, path = mapping
        f = self._open(pid, start, end, path)
        if f is None:
            return None
        with f:
            symbols = self._symbols(f)
            vaddr = symbols.vaddr(addr - start + offset) if symbols is not None else None
            return symbols.name_at(vaddr, f) if vaddr is not None else None

    def forget(self, pid: int) -> None:
        self._maps.pop(pid, None)

    @staticmethod
    def _mapping(pid: int, addr: int, maps) -> Optional[tuple[int, int, int, str]]:
        if not maps:
            return None
        i = bisect.bisect_right(maps, (addr, float("inf"))) - 1
        return maps[i] if i >= 0 and maps[i][0] <= addr < maps[i][1] else None

    def _read_maps(self, pid: int) -> list[tuple[int, int, int, str]]:
        """Readable, file-backed mappings, sorted by start: code (host stubs) and read-only
        data (HIP kernel handles)."""
        out = []
        try:
            with open(f"{self.proc_root}/{pid}/maps") as f:
                for line in f:
                    parts = line.split(None, 5)
                    if len(parts) < 6 or "r" not in parts[1] or not parts[5].startswith("/"):
                        continue
                    start, end = (int(x, 16) for x in parts[0].split("-"))
                    out.append((start, end, int(parts[2], 16), parts[5].rstrip("\n")))
        except (OSError, ValueError) as e:
            log.debug("pid %d: cannot read its maps: %s", pid, e)
        return sorted(out)

    def _open(self, pid: int, start: int, end: int, path: str) -> Optional[BinaryIO]:
        """The mapped file itself (map_files: even if deleted or replaced since), else
        the path in the process's root (a container's file system)."""
        for candidate in (f"{self.proc_root}/{pid}/map_files/{start:x}-{end:x}",
                          f"{self.proc_root}/{pid}/root{path.removesuffix(' (deleted)')}"):
            try:
                return open(candidate, "rb")
            except OSError:
                continue
        return None

    def _symbols(self, f: BinaryIO) -> Optional[FileSymbols]:
        st = os.fstat(f.fileno())
        key = (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns)
        if key in self._files:
            self._files.move_to_end(key)
            return self._files[key]
        try:
            symbols: Optional[FileSymbols] = FileSymbols(ElfFile(f))
        except (ValueError, OSError, struct.error) as e:  # not ELF, or truncated
            log.debug("no symbols from %s: %s", f.name, e)
            symbols = None
        self._files[key] = symbols
        while len(self._files) > self.max_files:
            self._files.popitem(last=False)
        return symbols
