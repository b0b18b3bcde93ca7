"""Attaches the CUDA probe table to each discovered file, once per file, and
detaches everything on shutdown."""
from __future__ import annotations

import logging

from .discovery import ProbeTarget
from .table import rows_for

log = logging.getLogger(__name__)


class Attacher:
    def __init__(self, bpf) -> None:
        self.bpf = bpf
        self.attached: dict[tuple, ProbeTarget] = {}
        self.probe_count = 0

    def attach(self, target: ProbeTarget) -> int:
        """Attaches every row that the file defines; returns how many probes."""
        if target.key in self.attached:
            return 0
        self.attached[target.key] = target
        n = 0
        for row in rows_for(target.kind):
            try:
                self.bpf.attach_uprobe(name=target.path.encode(), sym=row.symbol.encode(),
                                       fn_name=row.entry.encode())
                n += 1
                if row.ret:
                    self.bpf.attach_uretprobe(name=target.path.encode(), sym=row.symbol.encode(),
                                              fn_name=row.ret.encode())
                    n += 1
            except Exception as e:
                if "could not determine address" in str(e):  # absent in this build: normal for _ptsz
                    log.debug("no %s in %s", row.symbol, target.path)
                else:
                    log.warning("cannot attach %s to %s in %s: %s", row.entry, row.symbol, target.path, e)
        self.probe_count += n
        log.info("attached %d CUDA probes to %s", n, target.path)
        return n

    def detach_all(self) -> None:
        # bcc's cleanup detaches every uprobe and tracepoint it attached.
        self.bpf.cleanup()
        self.attached.clear()
