"""Which CPython a process runs, and where it keeps each thread's running
contextvars.Context: bpf/python_probes.c finds a thread's PyThreadState in the main
interpreter's thread list (by its thread_id, the thread's pthread_self()) and reads its
context, at the CUDA or socket call itself. No probe on the GIL: taking it back after
every blocking section (each PyTorch op) would cost a trap.

Recognition, from /proc/<pid>/maps and the exe link:
- a mapped `libpython3.X.so*` (or `3.Xd`, a debug build: same PyThreadState);
- else the executable, when its name is `python3.X` (or `3.Xd`);
- else the executable's exported `Py_Version` (3.11+), read from the ELF file.
Anything else is not taken for Python: a renamed 3.7-3.10 executable (no Py_Version),
free-threaded builds by name (`3.13t`: no build here to check its layout against),
versions not in the table, a file without the exported `_PyRuntime`. Their calls keep
ctx 0: today's attribution rules apply."""
from __future__ import annotations

import os
import re
import struct
from typing import NamedTuple, Optional

from ..proc import DELETED
from .elf_file import ElfFile


class Layout(NamedTuple):
    """Offsets in a CPython's runtime structures (x86-64 release builds)."""
    main_interp: int   # offsetof(_PyRuntimeState, interpreters.main)
    threads_head: int  # offsetof(PyInterpreterState, threads.head) (tstate_head before 3.11)
    thread_id: int     # offsetof(PyThreadState, thread_id): pthread_self() of its thread
    context: int       # offsetof(PyThreadState, context)


# Checked by tests/unit/probes/test_python.py against every CPython's headers found here
# and against each of those interpreters' own memory, through the C API.
LAYOUTS: dict[tuple[int, int], Layout] = {
    (3, 7): Layout(32, 8, 176, 256), (3, 8): Layout(40, 8, 176, 240), (3, 9): Layout(40, 8, 176, 240),
    (3, 10): Layout(40, 8, 176, 240), (3, 11): Layout(48, 16, 152, 224), (3, 12): Layout(48, 72, 136, 208),
    (3, 13): Layout(640, 7344, 152, 208),
}


class Interpreter(NamedTuple):
    """An interpreter file's facts: its layout, and where its `_PyRuntime` is."""
    layout: Layout
    runtime: int     # _PyRuntime's address in the file (its exported symbol)
    load_vaddr: int  # the address the file's offset 0 asks for (elf_file.load_vaddr)

    def main_interp_at(self, mapped_at: int) -> int:
        """The address of the pointer to the main interpreter, in a process that maps
        the file's offset 0 at `mapped_at`."""
        return mapped_at - self.load_vaddr + self.runtime + self.layout.main_interp


class PythonProcess(NamedTuple):
    """What bpf/python_probes.c needs of one process (its py_procs entry)."""
    layout: Layout
    main_interp: int  # the address of its pointer to the main interpreter


# ABI flags: d (debug: same PyThreadState), m (3.7's pymalloc); never t (free-threaded).
LIBPYTHON_RE = re.compile(r"/libpython3\.(\d+)d?m?\.so(?:\.\d+)*$")
EXE_RE = re.compile(r"(?:^|/)python3\.(\d+)d?m?$")


def libpython_in_maps(maps_text: str) -> Optional[str]:
    """The path of the first libpython3.X mapped, from /proc/<pid>/maps text."""
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].startswith("/"):
            path = parts[5].removesuffix(DELETED)
            if LIBPYTHON_RE.search(path):
                return path
    return None


def version_of_name(path: str) -> Optional[tuple[int, int]]:
    """(3, minor) from a libpython or executable name."""
    path = path.removesuffix(DELETED)
    m = LIBPYTHON_RE.search(path) or EXE_RE.search(path)
    return (3, int(m.group(1))) if m else None


def interpreter(path: str, version: Optional[tuple[int, int]]) -> Optional[Interpreter]:
    """The facts of the interpreter file at `path` (openable from here) of that version;
    None for a version not in LAYOUTS, or a file without an exported _PyRuntime."""
    layout = LAYOUTS.get(version) if version else None
    if layout is None:
        return None
    try:
        with open(path, "rb") as f:
            elf = ElfFile(f)
            runtime, load_vaddr = elf.symbol("_PyRuntime"), elf.load_vaddr()
    except (OSError, ValueError, struct.error):
        return None
    return None if runtime is None or load_vaddr is None else Interpreter(layout, runtime, load_vaddr)


def exported_version(path: str) -> Optional[tuple[int, int]]:
    """(3, minor) from the file's `Py_Version` symbol (3.11+: a const unsigned long,
    PY_VERSION_HEX); None when it has none, or is not a little-endian ELF64 file."""
    try:
        with open(path, "rb") as f:
            elf = ElfFile(f)
            at = elf.symbol("Py_Version")
            offset = elf.file_offset(at) if at is not None else None
            raw = elf.read(offset, 8) if offset is not None else b""
    except (OSError, ValueError, struct.error):
        return None
    if len(raw) != 8:
        return None
    (hexversion,) = struct.unpack("<Q", raw)
    major, minor = hexversion >> 24 & 0xFF, hexversion >> 16 & 0xFF
    return (3, minor) if major == 3 else None


def process(interp: Optional[Interpreter], maps_text: str, path: str) -> Optional[PythonProcess]:
    """The process's facts, from the interpreter file it maps at `path` (as its maps
    text names it), or None (not a known interpreter, or not mapped there)."""
    at = mapped_at(maps_text, path) if interp else None
    return None if at is None else PythonProcess(interp.layout, interp.main_interp_at(at))


TSTATE_NEXT = 8        # offsetof(PyThreadState, next), 3.7 to 3.13
# States the probes walk from the list's head (bpf/python_probes.c: each step is verified
# in every program that reads contexts, as a process's probes attach); older threads are
# found where thread_states listed them.
THREADS_WALKED = 16
MAX_THREAD_STATES = 4096  # a longer list is read this far: a loop, or not a list


def thread_states(mem_path: str, found: PythonProcess) -> Optional[dict[int, int]]:
    """pthread_self() -> PyThreadState* of every thread of the process's main interpreter,
    read from its memory (`mem_path`: /proc/<pid>/mem); None where it cannot be read (the
    probes then find only the threads near the list's head)."""
    out: dict[int, int] = {}
    try:
        with open(mem_path, "rb", buffering=0) as mem:
            def word(at: int) -> int:
                mem.seek(at)
                raw = mem.read(8)
                if len(raw) != 8:
                    raise OSError(f"short read at {at:#x}")
                return struct.unpack("<Q", raw)[0]
            interp = word(found.main_interp)
            ts, seen = (word(interp + found.layout.threads_head) if interp else 0), set()
            while ts and ts not in seen and len(seen) < MAX_THREAD_STATES:
                seen.add(ts)
                out[word(ts + found.layout.thread_id)] = ts
                ts = word(ts + TSTATE_NEXT)
    except (OSError, ValueError, OverflowError):
        return None
    return out


def mapped_at(maps_text: str, path: str) -> Optional[int]:
    """Where /proc/<pid>/maps text shows `path`'s file offset 0 mapped, or None."""
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) == 6 and parts[5].removesuffix(DELETED) == path and int(parts[2], 16) == 0:
            return int(parts[0].partition("-")[0], 16)
    return None


def exe_version(link: str, openable: str) -> Optional[tuple[int, int]]:
    """Version of an executable: by its name (`link`, as /proc/<pid>/exe gives it), else
    by Py_Version in the file (`openable`: the same file reachable from here)."""
    return version_of_name(link) or (exported_version(openable) if os.path.exists(openable) else None)
