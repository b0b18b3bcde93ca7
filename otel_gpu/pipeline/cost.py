"""Per-request GPU cost, estimated from what the host sees (not GPU counters).

Model: a request keeps its device busy from its first CUDA call to the end of its last
synchronising call (see model.BusyWindow). Where the windows of several requests of
the same process on the same device overlap, each overlapping stretch is split evenly
between them. GPU seconds x price per GPU-hour / 3600 = cost.

A finished request is held back until no other request that could overlap it is
still open (one whose first CUDA call came before this window's end), so the split is
exact; a request is never held longer than `max_hold_s`. Which requests are open with a
busy window, the stitcher says with BusyStarted records; held requests are released
as records arrive, at each Tick, and all of them at the final Tick."""
from __future__ import annotations

import glob
import time
from typing import Optional

from .model import Request
from .records import BusyStarted, ProcessGone, Tick


def split_seconds(window: tuple[int, int], others: list[tuple[int, int]]) -> float:
    """Seconds of `window` with each stretch divided by how many windows cover it.
    One sweep over the sorted edges: O(n log n) in the number of windows."""
    start, end = window
    if end <= start:
        return 0.0
    edges = [(start, 0), (end, 0)]  # (time, change in the count of *other* windows)
    for s, e in others:
        if s < end and e > start and e > s:
            edges.append((max(s, start), +1))
            edges.append((min(e, end), -1))
    edges.sort()
    total, covering, prev = 0.0, 0, start
    for t, delta in edges:
        if t > prev:
            total += (t - prev) / (1 + covering)
            prev = t
        covering += delta
    return total / 1e9


class Prices:
    """Price per GPU-hour: "2.5", or per device model "H100=4.1,A100=2.2,default=1.5"."""

    def __init__(self, spec: str = "0", currency: str = "USD", model: Optional[str] = None) -> None:
        self.currency = currency
        self.by_model: dict[str, float] = {}
        for part in (p.strip() for p in spec.split(",") if p.strip()):
            name, sep, value = part.rpartition("=")
            self.by_model[name.strip().lower() if sep else "default"] = float(value)
        if any(v < 0 for v in self.by_model.values()):
            raise ValueError("prices must not be negative")
        self.model = model if model is not None else gpu_model()
        self.per_hour = self._pick()

    def _pick(self) -> float:
        if self.model:
            for name, price in self.by_model.items():
                if name != "default" and name in self.model.lower():
                    return price
        return self.by_model.get("default", 0.0)


def gpu_model() -> Optional[str]:
    """The first GPU's model from the NVIDIA driver's procfs, when there is one."""
    for info in sorted(glob.glob("/proc/driver/nvidia/gpus/*/information")):
        try:
            for line in open(info):
                if line.startswith("Model:"):
                    return line.split(":", 1)[1].strip()
        except OSError:
            pass
    return None


class CostStage:
    """Stage: sets gpu_seconds, cost and feature on finished requests; passes on the rest."""

    def __init__(self, prices: Prices, feature_header: Optional[str] = None,
                 max_hold_s: float = 30.0, clock=time.monotonic) -> None:
        self.prices = prices
        self.feature_header = feature_header
        self.max_hold_s = max_hold_s
        self.clock = clock
        self._held: list[tuple[float, Request]] = []
        self._open: dict[int, list[Request]] = {}  # pid -> open requests with a busy window
        self._recent: dict[tuple[int, int], list[tuple[int, int]]] = {}  # (pid, device) -> windows

    def process(self, records: list) -> list:
        out = []
        for r in records:
            if isinstance(r, BusyStarted):
                self._open.setdefault(r.request.tgid, []).append(r.request)
            elif isinstance(r, Request):
                self._close(r)
                r.feature = self._feature(r)
                if not r.busy.empty:
                    self._recent.setdefault((r.tgid, r.busy.device), []).append((r.busy.start_ns, r.busy.end_ns))
                self._held.append((self.clock(), r))
            elif isinstance(r, ProcessGone):
                # Its requests leave before it does: later stages still know the process.
                self._open.pop(r.tgid, None)
                out = self._release(out, force=False, pid=r.tgid) + [r]
            elif isinstance(r, Tick) and r.final:
                out = self._release(out, force=True) + [r]
            else:
                out.append(r)
        return self._release(out, force=False)

    def state(self) -> dict:
        return {"held_for_cost": len(self._held)}

    def _close(self, r: Request) -> None:
        still = [o for o in self._open.get(r.tgid, ()) if o is not r]
        if still:
            self._open[r.tgid] = still
        else:
            self._open.pop(r.tgid, None)

    def _release(self, out: list, force: bool, pid: Optional[int] = None) -> list:
        """Prices and hands on the held requests that are settled (all of them with
        `force`, and all of process `pid`'s: nothing of a dead process can overlap)."""
        if not self._held:
            return out
        now, keep = self.clock(), []
        for held_since, r in self._held:
            if force or r.tgid == pid or now - held_since > self.max_hold_s or not self._may_still_overlap(r):
                self._price(r)
                out.append(r)
            else:
                keep.append((held_since, r))
        self._held = keep
        self._trim()
        return out

    def _may_still_overlap(self, r: Request) -> bool:
        if r.busy.empty:
            return False
        return any(o is not r and o.busy.device == r.busy.device and o.busy.start_ns < r.busy.end_ns
                   for o in self._open.get(r.tgid, ()))

    def _price(self, r: Request) -> None:
        if r.busy.empty:
            r.gpu_seconds = 0.0
        else:
            mine = (r.busy.start_ns, r.busy.end_ns)
            others = list(self._recent.get((r.tgid, r.busy.device), []))
            others.remove(mine)
            r.gpu_seconds = split_seconds(mine, others)
        r.cost = r.gpu_seconds * self.prices.per_hour / 3600.0

    def _trim(self) -> None:
        """Keep only windows that a held or open request could still overlap."""
        starts = [r.busy.start_ns for _, r in self._held if not r.busy.empty]
        for pid in {pid for pid, _ in self._recent}:
            starts += [o.busy.start_ns for o in self._open.get(pid, ())]
        horizon = min(starts, default=None)
        for key in list(self._recent):
            kept = [w for w in self._recent[key] if horizon is not None and w[1] > horizon]
            if kept:
                self._recent[key] = kept
            else:
                del self._recent[key]

    def _feature(self, r: Request) -> str:
        if self.feature_header:
            value = r.head.headers.get(self.feature_header)
            if value:
                return value[:128]
        return r.route or r.head.path
