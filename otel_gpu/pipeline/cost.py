"""Per-request GPU cost, estimated from what the host sees (not GPU counters).

Model: a request keeps its device busy from its first CUDA call to the end of its last
synchronising call (see model.BusyWindow). Where the windows of several requests of
the same process on the same device overlap, each overlapping stretch is split evenly
between them. GPU seconds x price per GPU-hour / 3600 = cost.

A request's split is exact once no other request that could overlap it is still open
(one whose first CUDA call came before this window's end). A finished request goes on
at once, priced if it is settled by the end of its batch; if not, it goes on with
`cost_pending` (its span and metrics must not wait for its neighbours: under steady
traffic some request is always open) and a RequestCost record follows once it is
settled, at most `max_hold_s` later. Which requests are open with a busy window, the
stitcher says with RequestOpened records; pending costs settle as records arrive, at
each Tick, and all of them at the final Tick.

ProcessWindows (ambiguous/outside calls of one process, one per flush; shared ones, one
per batch step) are busy by the same rule, from their calls. A window is charged only the stretches of its busy
interval that no request's window covers (the requests were charged those) and no
window priced before it covers; windows priced together split shared stretches
evenly. So per process and device, requests + windows = the union of busy time.
An ambiguous or shared window's seconds are split among its candidate requests (a shared
window's are requests of related processes) by how long each request was open during the
window's busy interval: `w.split`, labelled split, on the window (the requests' spans
may be out already)."""
from __future__ import annotations

import bisect
import time
from collections import OrderedDict
from dataclasses import dataclass
from typing import Optional

from ..config import price_table
from ..cuda_calls import BY_ID, Category
from ..gpu_devices import gpu_model
from ..records import ProcessGone, RequestCost, RequestOpened, Tick
from ..semconv import SERVICE_NAME
from ..value_cap import ValueCap
from .busy_time import remainder_seconds, shared_seconds, split_by_overlap, split_seconds
from .model import DEVICE, CallSink, ProcessWindow, Request

UNKNOWN_FEATURE = "(unknown)"  # a candidate request the stage never saw finish
MAX_FINISHED = 200_000         # finished requests remembered for windows' candidates


def _keep(table: dict, wanted) -> None:
    """Keeps in each list of `table` the items `wanted` says, and drops the keys left empty."""
    for key in list(table):
        kept = [x for x in table[key] if wanted(x)]
        if kept:
            table[key] = kept
        else:
            del table[key]


def _end(window: tuple[int, int]) -> int:
    return window[1]


def sink_busy(sink: CallSink) -> Optional[tuple[int, int]]:
    """A window's busy interval by BusyWindow's rule: first call to the end of the last
    synchronising call (else the last entry); a rollup spans first_ts..its last end."""
    spans = []
    for c, _ in sink.calls:
        spec = BY_ID.get(c.call)
        spans.append((c.ts_ns, c.ts_ns + (c.amounts()[2] if spec and spec.category is Category.SYNC else 0)))
    spans += [(a.first_ts, max(a.last_end_ts, a.last_ts)) for a in sink.rollups.values() if a.count]
    if not spans:
        return None
    return min(s for s, _ in spans), max(e for _, e in spans)


class Prices:
    """Price per GPU-hour: "2.5", or per device model "H100=4.1,A100=2.2,default=1.5"."""

    def __init__(self, spec: str = "0", currency: str = "USD", model: Optional[str] = None) -> None:
        self.currency = currency
        self.by_model = price_table(spec)  # config.py: parsed and checked once, there
        self.model = model if model is not None else gpu_model()
        self.per_hour = self._pick()

    def _pick(self) -> float:
        if self.model:
            for name, price in self.by_model.items():
                if name != "default" and name in self.model.lower():
                    return price
        return self.by_model.get("default", 0.0)


@dataclass
class _HeldWindow:
    since: float
    w: ProcessWindow
    device: int
    busy: Optional[tuple[int, int]]


def _device(w: ProcessWindow) -> int:
    # 0 is what the stitcher assumes before cudaSetDevice.
    return 0 if w.device is None else w.device


def _overlap(a: Optional[tuple[int, int]], b: Optional[tuple[int, int]]) -> bool:
    """Do two busy intervals overlap? A window with none (no calls) overlaps nothing."""
    return a is not None and b is not None and a[0] < b[1] and b[0] < a[1]


def _may_overlap(o: Request, device: int, end_ns: int) -> bool:
    """Could open request `o` still add GPU time on `device` before `end_ns`? Its busy
    window may not be open yet (its calls may be held until it binds a context), but it
    cannot start before the request did."""
    if o.busy.empty:
        return o.start_ns < end_ns
    return o.busy.device == device and o.busy.start_ns < end_ns


class CostStage:
    """Stage: sets feature, gpu_seconds and cost on finished requests (or cost_pending,
    then a RequestCost), gpu_seconds, cost and split on windows; passes on the rest."""

    def __init__(self, prices: Prices, feature_header: Optional[str] = None,
                 max_hold_s: float = 30.0, clock=time.monotonic, feature_cap: Optional[ValueCap] = None) -> None:
        self.prices = prices
        self.feature_header = feature_header
        # A header's values are the client's choice: bounded per service like routes.
        self.feature_cap = feature_cap or ValueCap(counter="features_folded")
        self.max_hold_s = max_hold_s
        self.clock = clock
        self._held: list[tuple[float, Request]] = []
        self._open: dict[int, list[Request]] = {}  # pid -> open requests
        # (pid, device) -> requests' busy windows, by end: a request's overlap with them is
        # found by bisection (an O(n) scan per request was 10 % of the collector's CPU).
        self._recent: dict[tuple[int, int], list[tuple[int, int]]] = {}
        self._longest: dict[tuple[int, int], int] = {}  # the longest of them: no later end can overlap
        # (pid, device) -> (start, end, Tick generation): time already charged, to a
        # request or a priced window, kept for the windows still to come.
        self._charged: dict[tuple[int, int], list[tuple[int, int, int]]] = {}
        self._held_windows: list[_HeldWindow] = []
        # (pid, device) -> [(last end, device intervals)] of device-clock requests, for the same
        # purpose as _recent: what a request's device time is split with.
        self._device_recent: dict[tuple[int, int], list[tuple[int, tuple]]] = {}
        # ... and as _charged: device time charged to a request or a priced window, with the
        # Tick generation, for the windows still to come.
        self._device_charged: dict[tuple[int, int], list[tuple[int, tuple, int]]] = {}
        # (trace_id, span_id) -> (start_ns, end_ns, feature, generation): windows come at
        # the Tick after their candidates finished.
        self._finished: OrderedDict = OrderedDict()
        self._gen = 0  # Ticks seen

    def process(self, records: list) -> list:
        out = []
        for r in records:
            if isinstance(r, RequestOpened):
                self._open.setdefault(r.request.tgid, []).append(r.request)
            elif isinstance(r, Request):
                self._close(r)
                r.feature = self._feature(r)
                if not r.busy.empty:
                    key, busy = (r.tgid, r.busy.device), (r.busy.start_ns, r.busy.end_ns)
                    bisect.insort(self._recent.setdefault(key, []), busy, key=_end)  # mostly at the end
                    self._longest[key] = max(self._longest.get(key, 0), busy[1] - busy[0])
                    self._charged.setdefault(key, []).append((*busy, self._gen))
                    if r.device_busy:
                        end = max(e for _, e in r.device_busy)
                        self._device_recent.setdefault(key, []).append((end, r.device_busy))
                        self._device_charged.setdefault(key, []).append((end, r.device_busy, self._gen))
                self._finished[(r.trace_id, r.span_id)] = (r.start_ns, r.end_ns, r.feature, self._gen)
                self._held.append((self.clock(), r))
            elif isinstance(r, ProcessWindow):
                self._held_windows.append(_HeldWindow(self.clock(), r, _device(r), sink_busy(r.sink)))
            elif isinstance(r, ProcessGone):
                # Its requests leave before it does: later stages still know the process.
                self._open.pop(r.tgid, None)
                out = self._release(out, force=False, pid=r.tgid) + [r]
            elif isinstance(r, Tick):
                out = (self._release(out, force=True) if r.final else out) + [r]
                self._gen += 1
                self._trim_for_windows()
            else:
                out.append(r)
        return self._release(out, force=False)

    def state(self) -> dict:
        return {"held_for_cost": len(self._held), "windows_held_for_cost": len(self._held_windows)}

    def _close(self, r: Request) -> None:
        still = [o for o in self._open.get(r.tgid, ()) if o is not r]
        if still:
            self._open[r.tgid] = still
        else:
            self._open.pop(r.tgid, None)

    def _release(self, out: list, force: bool, pid: Optional[int] = None) -> list:
        """Prices and hands on the held requests and windows that are settled (all of them
        with `force`, and all of process `pid`'s: nothing of a dead process can overlap);
        a request not settled goes on unpriced, its cost to follow."""
        now = self.clock()
        if self._held_windows:
            self._release_windows(out, now, force, pid)
        if not self._held:
            return out
        keep = []
        for held_since, r in self._held:
            if force or r.tgid == pid or now - held_since > self.max_hold_s or not self._may_still_overlap(r):
                self._price(r)
                out.append(RequestCost(r) if r.cost_pending else r)
            else:
                if not r.cost_pending:
                    r.cost_pending = True
                    out.append(r)
                keep.append((held_since, r))
        self._held = keep
        self._trim()
        return out

    def _may_still_overlap(self, r: Request) -> bool:
        if r.busy.empty:
            return False
        end = max(r.busy.end_ns, *(e for _, e in r.device_busy)) if r.device_busy else r.busy.end_ns
        return any(o is not r and _may_overlap(o, r.busy.device, end) for o in self._open.get(r.tgid, ()))

    def _price(self, r: Request) -> None:
        if r.device_busy is not None and not r.busy.empty:
            key = (r.tgid, r.busy.device)
            start = min(s for s, _ in r.device_busy) if r.device_busy else 0
            others = [iv for end, iv in self._device_recent.get(key, ()) if iv is not r.device_busy and end > start]
            r.gpu_seconds, r.cost_source = shared_seconds(r.device_busy, peers=others), DEVICE
        elif r.busy.empty:
            r.gpu_seconds = 0.0
        else:
            mine = (r.busy.start_ns, r.busy.end_ns)
            key = (r.tgid, r.busy.device)
            windows = self._recent.get(key, [])
            # Those ending after it starts and starting before it ends (so ending before
            # its end plus the longest window's length).
            first = bisect.bisect_right(windows, mine[0], key=_end)
            last = bisect.bisect_left(windows, mine[1] + self._longest.get(key, 0), key=_end)
            others = [w for w in windows[first:last] if w[0] < mine[1]]
            if mine in others:  # itself (absent only when empty: no seconds)
                others.remove(mine)
            r.gpu_seconds = split_seconds(mine, others)
        r.cost = r.gpu_seconds * self.prices.per_hour / 3600.0

    # --- windows -----------------------------------------------------------------
    def _release_windows(self, out: list, now: float, force: bool, pid: Optional[int]) -> None:
        """A process's windows go together (their shared stretches split evenly), once
        every candidate has finished and no open request can overlap them. While some
        wait, the others that overlap none of those go (a process under steady load has
        a batch step in flight at all times)."""
        by_pid: dict[int, list[_HeldWindow]] = {}
        for hw in self._held_windows:
            by_pid.setdefault(hw.w.tgid, []).append(hw)
        keep = []
        for tgid, group in by_pid.items():
            if force or tgid == pid or any(now - hw.since > self.max_hold_s for hw in group):
                ready = group
            else:
                waiting = [hw for hw in group if self._window_waits(hw)]
                ready = [hw for hw in group if hw not in waiting
                         and not any(_overlap(hw.busy, o.busy) for o in waiting)]
            if ready:
                self._price_windows(ready)
                out.extend(hw.w for hw in ready)
            keep += [hw for hw in group if hw not in ready]
        self._held_windows = keep

    def _window_waits(self, hw: _HeldWindow) -> bool:
        if any(c not in self._finished for c in hw.w.candidates):
            return True
        return hw.busy is not None and any(
            _may_overlap(o, hw.device, hw.busy[1]) for o in self._open.get(hw.w.tgid, ()))

    def _price_windows(self, group: list[_HeldWindow]) -> None:
        for hw in group:
            key = (hw.w.tgid, hw.device)
            seconds = 0.0
            if hw.w.device_busy is not None:  # device-clock mode: what no request's device time covers
                taken = [iv for _, ivs, _ in self._device_charged.get(key, ()) for iv in ivs]
                peers = [o.w.device_busy for o in group if o is not hw and o.w.device_busy and o.device == hw.device]
                seconds, hw.w.cost_source = shared_seconds(hw.w.device_busy, taken, peers), DEVICE
            elif hw.busy is not None:
                taken = [(s, e) for s, e, _ in self._charged.get(key, ())]
                peers = [o.busy for o in group if o is not hw and o.busy is not None and o.device == hw.device]
                seconds = remainder_seconds(hw.busy, taken, peers)
            w = hw.w
            w.gpu_seconds, w.cost = seconds, seconds * self.prices.per_hour / 3600.0
            known = {c: self._finished.get(c) for c in w.candidates}
            w.split = split_by_overlap(seconds, hw.busy or (0, 0),
                                       {c: info and info[:2] for c, info in known.items()})
            w.split_features = {c: (info and info[2]) or UNKNOWN_FEATURE for c, info in known.items()}
        for hw in group:
            if hw.busy is not None:
                self._charged.setdefault((hw.w.tgid, hw.device), []).append((*hw.busy, self._gen))
            if hw.w.device_busy:
                self._device_charged.setdefault((hw.w.tgid, hw.device), []).append(
                    (max(e for _, e in hw.w.device_busy), hw.w.device_busy, self._gen))

    def _trim(self) -> None:
        """Keep only windows that a held or open request could still overlap."""
        starts = [r.busy.start_ns for _, r in self._held if not r.busy.empty]
        for pid in {pid for pid, _ in self._recent}:
            starts += [o.start_ns if o.busy.empty else o.busy.start_ns for o in self._open.get(pid, ())]
        horizon = min(starts, default=None)
        for key in list(self._recent):
            windows = self._recent[key]
            kept = windows[bisect.bisect_right(windows, horizon, key=_end):] if horizon is not None else []
            if kept:
                self._recent[key] = kept
            else:
                del self._recent[key]
                self._longest.pop(key, None)
        _keep(self._device_recent, lambda d: horizon is not None and d[0] > horizon)

    def _trim_for_windows(self) -> None:
        """At each Tick: keep what this and the last Tick brought (a window comes at the
        Tick after its requests) and what a held window still needs."""
        horizon = min((hw.busy[0] for hw in self._held_windows if hw.busy is not None), default=None)
        _keep(self._charged, lambda w: w[2] >= self._gen - 1 or (horizon is not None and w[1] > horizon))
        _keep(self._device_charged, lambda d: d[2] >= self._gen - 1 or (horizon is not None and d[0] > horizon))
        wanted = {c for hw in self._held_windows for c in hw.w.candidates}
        for key in list(self._finished):
            over = len(self._finished) > MAX_FINISHED
            if not over and self._finished[key][3] >= self._gen - 1:
                break  # insertion order is generation order
            if over or key not in wanted:
                del self._finished[key]

    def _feature(self, r: Request) -> str:
        if self.feature_header:
            value = r.head.headers.get(self.feature_header)
            if value:
                service = r.resource.attributes.get(SERVICE_NAME, "") if r.resource is not None else ""
                return self.feature_cap.bound(str(service), value[:128])
        return r.route or r.head.path  # enrich set the bounded route (path: no enrich stage)
