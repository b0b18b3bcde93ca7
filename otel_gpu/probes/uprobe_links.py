"""How a uprobe is planted: an uprobe_multi link (kernel 6.6+) or, where the kernel has
none, bcc's perf-event uprobe. Both take a file, a symbol (or an address) and a BPF
function, for every process or for one, and return the handles that detach it: link
descriptors (LinkFd) or bcc event names. The closer (probes/closer.py) takes either.

Why links first: a perf-event uprobe's close waits for the kernel's grace periods,
~0.1-0.25 s each, one probe after another (a collector with 156 probes took 18 s to
stop); a link's close is one grace period, and closes overlap. The link's pid filter
is a pointer compare; a per-process perf uprobe takes a lock at every hit."""
from __future__ import annotations

import logging
from typing import Optional

from ..config import UPROBE_LINKS
from . import uprobe_multi
from .prologue import entry_code, entry_skip, skip

log = logging.getLogger(__name__)

# OTEL_GPU_UPROBE_LINKS / --uprobe-links: auto (links where the kernel has them), or one of these.
CHOICES = UPROBE_LINKS
_, MULTI, PERF = CHOICES


class LinkFd(int):
    """A uprobe_multi link's descriptor: closing it detaches the probe."""


class PerfUprobes:
    """bcc's perf-event uprobes (one event, one descriptor, per probe)."""
    name = "perf-event uprobes"

    def __init__(self, bpf) -> None:
        self.bpf = bpf

    def prepare(self, fn_names: list) -> None:
        """Nothing ahead: bcc loads each function as its first probe attaches."""

    def attach(self, path: str, fn_name: str, symbol: str = "", addr: Optional[int] = None,
               ret: bool = False, pid: Optional[int] = None) -> list:
        """bcc's event names added for this probe (raises on failure). Past a leading
        endbr64 (prologue.py), except a return probe named by its symbol: bcc takes no
        offset for those (this backend is the fallback of kernels before 6.6)."""
        before = set(self.bpf.uprobe_fds)
        skip = _skip(path, symbol, addr)
        common = {"name": path.encode(), "sym": symbol.encode(), "fn_name": fn_name.encode(),
                  "pid": -1 if pid is None else pid}
        if addr is not None:  # a virtual address: the skip moves it within the function
            common["addr"] = addr + skip
        if ret:
            self.bpf.attach_uretprobe(**common)
        else:
            self.bpf.attach_uprobe(**common, **({"sym_off": skip} if skip and addr is None else {}))
        return [ev for ev in self.bpf.uprobe_fds if ev not in before]


def _skip(path: str, symbol: str, addr: Optional[int]) -> int:
    """prologue.skip for a symbol or an address; 0 where bcc cannot resolve it (the
    attach then says why)."""
    return skip(entry_code(path, symbol, addr))


class MultiLinks:
    """One uprobe_multi link per probe. The BPF functions are loaded for this attach
    type (bcc caches them by name: a function is either link or perf, never both)."""
    name = "uprobe_multi links"

    def __init__(self, bpf) -> None:
        self.bpf = bpf

    def prepare(self, fn_names: list) -> None:
        """The functions a file's probes will run, in their order, start loading (verifying)
        side by side where the program came from the cache (cached_bpf.load_ahead): 37
        programs for the default files took ~0.3 s one after another here, most of the
        start's attach time."""
        from bcc import BPF

        from .cached_bpf import load_ahead
        load_ahead(self.bpf, fn_names, BPF.KPROBE, attach_type=uprobe_multi.BPF_TRACE_UPROBE_MULTI)

    def attach(self, path: str, fn_name: str, symbol: str = "", addr: Optional[int] = None,
               ret: bool = False, pid: Optional[int] = None) -> list:
        from bcc import BPF
        # bcc resolves the symbol (or an address) to the file offset a uprobe takes; past a
        # leading endbr64 when a push follows (prologue.py), for a return probe too (the
        # return address is where it was).
        _, offset = BPF._check_path_symbol(path.encode(), symbol.encode(), addr, -1)
        offset += entry_skip(path, offset)
        fn = self.bpf.load_func(fn_name.encode(), BPF.KPROBE, attach_type=uprobe_multi.BPF_TRACE_UPROBE_MULTI)
        return [LinkFd(uprobe_multi.attach(fn.fd, path, [offset], ret=ret, pid=pid))]


def choose(bpf, setting: str = "auto"):
    """The backend for `setting` (CHOICES); auto: links where the kernel makes them.
    Logs which, once."""
    if setting == PERF:
        log.info("uprobes: %s (as configured)", PerfUprobes.name)
        return PerfUprobes(bpf)
    ok, why = uprobe_multi.supported()
    if ok:
        log.info("uprobes: %s", MultiLinks.name)
        return MultiLinks(bpf)
    if setting == MULTI:
        raise RuntimeError(f"uprobe_multi links were asked for but cannot be made: {why}")
    log.info("uprobes: %s (no uprobe_multi links here: %s)", PerfUprobes.name, why)
    return PerfUprobes(bpf)
