"""Kernel names: the launch's function pointer lies in some mapped module
(executable, libtorch_cuda.so, ...); bcc's symbolizer finds the module through
/proc/<pid>/maps, looks the offset up in its ELF symbol tables and demangles."""
from __future__ import annotations

from typing import Optional


class KernelNames:
    def __init__(self, max_entries: int = 65536) -> None:
        self._names: dict[tuple[int, int], Optional[str]] = {}
        self._refreshed: set[int] = set()
        self.max_entries = max_entries

    def __call__(self, pid: int, func: int) -> Optional[str]:
        key = (pid, func)
        if key in self._names:
            return self._names[key]
        name = self._resolve(pid, func)
        if name is None and pid not in self._refreshed:
            # The module may have been loaded after bcc cached this process's maps.
            self._refreshed.add(pid)
            self._drop_bcc_cache(pid)
            name = self._resolve(pid, func)
        if len(self._names) < self.max_entries:
            self._names[key] = name
        return name

    @staticmethod
    def _resolve(pid: int, func: int) -> Optional[str]:
        if not func:
            return None
        from bcc import BPF
        sym = BPF.sym(func, pid, show_module=False, show_offset=False, demangle=True)
        text = sym.decode(errors="replace") if isinstance(sym, bytes) else str(sym)
        return None if text.startswith("[unknown]") else text

    @staticmethod
    def _drop_bcc_cache(pid: int) -> None:
        from bcc import BPF
        BPF._sym_caches.pop(pid, None)

    def forget(self, pid: int) -> None:
        for key in [k for k in self._names if k[0] == pid]:
            del self._names[key]
        self._refreshed.discard(pid)
        self._drop_bcc_cache(pid)
