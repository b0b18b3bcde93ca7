"""Hands back the memory the BPF compile leaves behind, once the program is loaded.

bcc compiles with clang/LLVM inside this process. Measured on the 2-core VM: the
compile adds ~73 MB of RSS: ~35 MB of freed heap that glibc keeps mapped, and ~72 MB
of libLLVM/libclang-cpp code and read-only data paged in (shared with the page cache,
but counted in our RSS). Neither is used again unless something compiles again, and
then it simply faults back in from the library files."""
from __future__ import annotations

import ctypes as ct
import logging
from dataclasses import dataclass
from typing import Iterable

from .. import proc

log = logging.getLogger(__name__)

COMPILER_LIBRARIES = ("libLLVM", "libclang")
MADV_DONTNEED = 4
# Only mappings that can never hold our own writes: their pages always equal the file's.
_READ_ONLY = ("r-xp", "r--p")


@dataclass(frozen=True)
class Mapping:
    start: int
    end: int
    perms: str
    path: str
    rss_kb: int
    anonymous_kb: int  # copy-on-write pages (relocations): those must stay


def parse_smaps(text: str) -> list[Mapping]:
    """/proc/<pid>/smaps -> its mappings; a malformed block is skipped."""
    out, head, fields = [], None, {}

    def flush():
        if head is not None:
            try:
                start, end = (int(x, 16) for x in head[0].split("-"))
                out.append(Mapping(start, end, head[1], head[5] if len(head) > 5 else "",
                                   int(fields.get("Rss", -1)), int(fields.get("Anonymous", -1))))
            except (ValueError, IndexError):
                pass

    for line in text.splitlines():
        parts = line.split()
        if not parts:
            continue
        if parts[0].endswith(":"):
            if len(parts) > 1:
                fields[parts[0][:-1]] = parts[1]
            continue
        flush()
        head, fields = parts, {}
    flush()
    return out


def droppable(mappings: Iterable[Mapping], names: Iterable[str] = COMPILER_LIBRARIES) -> list[Mapping]:
    """Read-only mappings of the named libraries with no private copy of any page."""
    names = tuple(names)
    return [m for m in mappings if m.perms in _READ_ONLY and m.anonymous_kb == 0 and m.rss_kb > 0
            and any(n in m.path.rsplit("/", 1)[-1] for n in names)]


def release(names: Iterable[str] = COMPILER_LIBRARIES, proc_root: str = "/proc") -> int:
    """malloc_trim, then drops the resident pages of the libraries' read-only mappings
    from this process. Returns the kB dropped from those mappings (0 when none)."""
    try:
        libc = ct.CDLL("libc.so.6", use_errno=True)
        libc.malloc_trim(0)
    except (OSError, AttributeError):  # not glibc: nothing to hand back this way
        return 0
    try:
        text = proc.read_text(proc_root, "self", "smaps")
    except OSError as e:
        log.debug("smaps unreadable (%s): compiler pages stay resident", e)
        return 0
    libc.madvise.argtypes = [ct.c_void_p, ct.c_size_t, ct.c_int]
    dropped = 0
    for m in droppable(parse_smaps(text), names):
        if libc.madvise(m.start, m.end - m.start, MADV_DONTNEED) == 0:
            dropped += m.rss_kb
    return dropped
