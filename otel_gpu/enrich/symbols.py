"""Kernel names. A runtime launch's function pointer is a host stub in some mapped
module (executable, libtorch_cuda.so, ...), named from that file's ELF symbol tables
(code_symbols.py) and demangled. A
driver launch (cuBLAS, Triton, NCCL) and a CUDA 13 `<<<>>>` launch on a GPU pass an
opaque handle instead: what it names was learned when a probed call handed it out
(records.KernelHandle: a mangled name, or the host stub / CUkernel it stands for)."""
from __future__ import annotations

import ctypes as ct
import ctypes.util
import logging
from typing import Callable, Optional

from .. import sanitize
from ..records import KernelHandle
from .code_symbols import CodeSymbols

log = logging.getLogger(__name__)
MAX_HOPS = 4  # CUfunction -> CUkernel -> name: two; a cycle ends here


class HandleMap:
    """Per process: handle -> (name, source), learned from KernelHandle records. Bounded
    in all (a full map drops new handles, counted); a process's handles go with it."""

    def __init__(self, max_entries: int = 65536) -> None:
        self.max_entries = max_entries
        self._by_pid: dict[int, dict[int, tuple[Optional[str], int]]] = {}
        self._size = 0
        self.learned = 0
        self.dropped = 0  # handles not kept: the map was full

    def learn(self, r: KernelHandle) -> bool:
        """Keeps what `r` says; False when it says nothing usable (a failed call, an
        unreadable handle, a handle that is its own host stub)."""
        if r.ret != 0 or r.unreadable or not r.handle or (not r.name and not r.source) or r.source == r.handle:
            return False
        handles = self._by_pid.setdefault(r.tgid, {})
        if r.handle not in handles:
            if self._size >= self.max_entries:
                if not self.dropped:
                    log.warning("kernel handle map full (%d): launches of newer handles stay unnamed "
                                "(counted in kernel_handles_dropped)", self.max_entries)
                self.dropped += 1
                return False
            self._size += 1
        handles[r.handle] = (r.name, r.source)
        self.learned += 1
        return True

    def resolve(self, pid: int, func: int) -> tuple[Optional[str], int]:
        """(a learned name, None) or (None, the address to symbolise: `func` itself when
        nothing was learned about it, else the host stub it leads to)."""
        handles = self._by_pid.get(pid, {})
        addr = func
        for _ in range(MAX_HOPS):
            entry = handles.get(addr)
            if entry is None:
                break
            name, source = entry
            if name:
                return name, 0
            addr = source
        return None, addr

    def forget(self, pid: int) -> None:
        self._size -= len(self._by_pid.pop(pid, {}))

    def __len__(self) -> int:
        return self._size


def _cxa_demangle() -> Optional[Callable]:
    path = ctypes.util.find_library("stdc++")
    try:
        lib, libc = ct.CDLL(path or "libstdc++.so.6"), ct.CDLL(None)
        fn = lib.__cxa_demangle
    except (OSError, AttributeError):
        log.info("no libstdc++ __cxa_demangle: driver kernel names stay mangled")
        return None
    fn.restype, fn.argtypes = ct.c_void_p, [ct.c_char_p, ct.c_void_p, ct.c_void_p, ct.POINTER(ct.c_int)]
    libc.free.argtypes = [ct.c_void_p]
    return lambda mangled: _call_demangle(fn, libc.free, mangled)


def _call_demangle(fn, free, mangled: bytes) -> Optional[str]:
    status = ct.c_int(0)
    out = fn(mangled, None, None, ct.byref(status))
    if not out or status.value != 0:
        return None
    try:
        return ct.string_at(out).decode(errors="replace")
    finally:
        free(out)


_DEMANGLE = _cxa_demangle()


def demangle(name: str) -> str:
    """An Itanium-mangled symbol (what cuModuleGetFunction is asked for) as the runtime
    path's symbolizer shows it; anything else (Triton's plain names, a name cut at the
    cap) as it is."""
    if not name.startswith("_Z") or _DEMANGLE is None:
        return name
    return _DEMANGLE(name.encode(errors="replace")) or name


MAX_KERNEL_NAME = 4096  # demangled C++ template names run to a few KiB


class KernelNames:
    """(pid, func) -> the kernel's demangled name, sanitised (it comes from the traced
    process's own files: cleaned like the network's), or None; kept once resolved."""

    def __init__(self, max_entries: int = 65536, handles: Optional[HandleMap] = None,
                 symbols: Optional[CodeSymbols] = None) -> None:
        self._names: dict[tuple[int, int], Optional[str]] = {}
        self.max_entries = max_entries
        self.handles = handles or HandleMap()
        self.symbols = symbols or CodeSymbols()

    def learn(self, r: KernelHandle) -> bool:
        if not self.handles.learn(r):
            return False
        self._names.pop((r.tgid, r.handle), None)  # it may have been looked up, unnamed, before
        return True

    def __call__(self, pid: int, func: int) -> Optional[str]:
        key = (pid, func)
        if key in self._names:
            return self._names[key]
        name, addr = self.handles.resolve(pid, func)
        if name is None and addr:
            name = self.symbols.name(pid, addr)
        if name is not None:
            name = sanitize.text(demangle(name), MAX_KERNEL_NAME)
        if len(self._names) < self.max_entries:
            self._names[key] = name
        return name

    def forget(self, pid: int) -> None:
        for key in [k for k in self._names if k[0] == pid]:
            del self._names[key]
        self.handles.forget(pid)
        self.symbols.forget(pid)
