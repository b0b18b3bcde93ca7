"""Which CPython a process runs, and where its thread state keeps the running
contextvars.Context (bpf/python_probes.c reads PyThreadState + that offset).

Recognition, from /proc/<pid>/maps and the exe link:
- a mapped `libpython3.X.so*` (or `3.Xd`, a debug build: same PyThreadState);
- else the executable, when its name is `python3.X` (or `3.Xd`);
- else the executable's exported `Py_Version` (3.11+), read from the ELF file.
Anything else is not taken for Python: a renamed 3.9/3.10 executable (no Py_Version),
free-threaded builds by name (`3.13t`: no build here to check its layout against),
versions not in the table. Their calls keep ctx 0: today's attribution rules apply."""
from __future__ import annotations

import os
import re
import struct
from typing import Optional

# offsetof(PyThreadState, context) on x86-64 release builds. Checked by
# tests/unit/probes/test_python.py against every interpreter's headers found here.
CONTEXT_OFFSET: dict[tuple[int, int], int] = {
    (3, 7): 256, (3, 8): 240, (3, 9): 240, (3, 10): 240, (3, 11): 224, (3, 12): 208, (3, 13): 208,
}

# ABI flags: d (debug: same PyThreadState), m (3.7's pymalloc); never t (free-threaded).
LIBPYTHON_RE = re.compile(r"/libpython3\.(\d+)d?m?\.so(?:\.\d+)*$")
EXE_RE = re.compile(r"(?:^|/)python3\.(\d+)d?m?$")


def libpython_in_maps(maps_text: str) -> Optional[str]:
    """The path of the first libpython3.X mapped, from /proc/<pid>/maps text."""
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path = parts[5].removesuffix(" (deleted)")
            if LIBPYTHON_RE.search(path):
                return path
    return None


def version_of_name(path: str) -> Optional[tuple[int, int]]:
    """(3, minor) from a libpython or executable name."""
    path = path.removesuffix(" (deleted)")
    m = LIBPYTHON_RE.search(path) or EXE_RE.search(path)
    return (3, int(m.group(1))) if m else None


def context_offset(version: Optional[tuple[int, int]]) -> Optional[int]:
    return CONTEXT_OFFSET.get(version) if version else None


_SHDR = struct.Struct("<IIQQQQIIQQ")  # Elf64_Shdr
_SYM = struct.Struct("<IBBHQQ")       # Elf64_Sym
SHT_SYMTAB, SHT_DYNSYM = 2, 11


def exported_version(path: str) -> Optional[tuple[int, int]]:
    """(3, minor) from the file's `Py_Version` symbol (3.11+: a const unsigned long,
    PY_VERSION_HEX); None when it has none, or is not a little-endian ELF64 file."""
    try:
        with open(path, "rb") as f:
            return _py_version(f)
    except (OSError, struct.error, IndexError):
        return None


def _py_version(f) -> Optional[tuple[int, int]]:
    ehdr = f.read(64)
    if ehdr[:6] != b"\x7fELF\x02\x01":
        return None
    (shoff,) = struct.unpack_from("<Q", ehdr, 0x28)
    shentsize, shnum = struct.unpack_from("<HH", ehdr, 0x3A)
    f.seek(shoff)
    raw = f.read(shentsize * shnum)
    secs = [_SHDR.unpack_from(raw, i * shentsize) for i in range(shnum)]
    for type_ in (SHT_DYNSYM, SHT_SYMTAB):
        for sec in secs:
            if sec[1] != type_:
                continue
            strtab = secs[sec[6]]
            names = _read(f, strtab[4], strtab[5])
            # Every place the name could start (linkers share string tails).
            at = {m.start() for m in re.finditer(rb"Py_Version\0", names)}
            if not at:
                continue
            for st_name, _, _, shndx, value, _ in _SYM.iter_unpack(_read(f, sec[4], sec[5] - sec[5] % 24)):
                if st_name in at and 0 < shndx < len(secs):
                    holder = secs[shndx]  # file offset = section offset + (address - section address)
                    (hexversion,) = struct.unpack("<Q", _read(f, holder[4] + value - holder[3], 8))
                    major, minor = hexversion >> 24 & 0xFF, hexversion >> 16 & 0xFF
                    return (3, minor) if major == 3 else None
    return None


def _read(f, offset: int, size: int) -> bytes:
    f.seek(offset)
    data = f.read(size)
    if len(data) != size:
        raise IndexError("short read")
    return data


def exe_version(link: str, openable: str) -> Optional[tuple[int, int]]:
    """Version of an executable: by its name (`link`, as /proc/<pid>/exe gives it), else
    by Py_Version in the file (`openable`: the same file reachable from here)."""
    return version_of_name(link) or (exported_version(openable) if os.path.exists(openable) else None)
