"""The address of a shared library's DT_INIT function (the one the dynamic loader
runs once in each process as it loads the library), read from the ELF dynamic
section: a uprobe there fires once per process and load, so it says "this process
just mapped the library" without trapping any later call."""
from __future__ import annotations

import struct
from typing import Optional

from .elf_file import PT_DYNAMIC, ElfFile

DT_NULL, DT_INIT = 0, 12
MAX_DYNAMIC = 4096  # entries; a real dynamic section has a few dozen


def init_address(path: str) -> Optional[int]:
    """DT_INIT's virtual address in a little-endian ELF64 file, or None (not such a
    file, unreadable, or no DT_INIT: some libraries only have DT_INIT_ARRAY)."""
    try:
        with open(path, "rb") as f:
            elf = ElfFile(f)
            dynamic = next((s for s in elf.segments if s.type == PT_DYNAMIC), None)
            if dynamic is None:
                return None
            data = elf.read(dynamic.offset, min(dynamic.filesz, MAX_DYNAMIC * 16))
    except (OSError, struct.error, ValueError):
        return None
    for tag, value in struct.iter_unpack("<qQ", data[:len(data) // 16 * 16]):
        if tag == DT_NULL:
            break
        if tag == DT_INIT:
            # Only an address inside a loaded segment of the file is a real function.
            return value if value and elf.file_offset(value) is not None else None
    return None
