"""The address of a shared library's DT_INIT function (the one the dynamic loader
runs once in each process as it loads the library), read from the ELF dynamic
section: a uprobe there fires once per process and load, so it says "this process
just mapped the library" without trapping any later call."""
from __future__ import annotations

import struct
from typing import Optional

PT_LOAD, PT_DYNAMIC = 1, 2
DT_NULL, DT_INIT = 0, 12
MAX_DYNAMIC = 4096  # entries; a real dynamic section has a few dozen


def init_address(path: str) -> Optional[int]:
    """DT_INIT's virtual address in a little-endian ELF64 file, or None (not such a
    file, unreadable, or no DT_INIT: some libraries only have DT_INIT_ARRAY)."""
    try:
        with open(path, "rb") as f:
            head = f.read(64)
            if len(head) < 64 or head[:4] != b"\x7fELF" or head[4] != 2 or head[5] != 1:
                return None
            phoff, = struct.unpack_from("<Q", head, 32)
            phentsize, phnum = struct.unpack_from("<HH", head, 54)
            if phentsize < 56 or phnum > 256:
                return None
            f.seek(phoff)
            table = f.read(phentsize * phnum)
            loads, dynamic = [], None
            for i in range(phnum):
                p_type, _, p_offset, p_vaddr, _, p_filesz, _ = struct.unpack_from("<IIQQQQQ", table, i * phentsize)
                if p_type == PT_LOAD:
                    loads.append((p_vaddr, p_offset, p_filesz))
                elif p_type == PT_DYNAMIC:
                    dynamic = (p_offset, p_filesz)
            if dynamic is None:
                return None
            f.seek(dynamic[0])
            data = f.read(min(dynamic[1], MAX_DYNAMIC * 16))
    except (OSError, struct.error):
        return None
    for tag, value in struct.iter_unpack("<qQ", data[:len(data) // 16 * 16]):
        if tag == DT_NULL:
            break
        if tag == DT_INIT:
            # Only an address inside a loaded segment of the file is a real function.
            return value if value and any(v <= value < v + n for v, _, n in loads) else None
    return None
