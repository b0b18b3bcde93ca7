"""Per process, whether its runtime launch probes are attached: one program run per
launch where the runtime reaches the driver (#44). bpf/launch_routes.c keeps every launch
counted exactly once whichever probes are attached, and counts a launch at the driver's
probe in the runtime's name once the runtime's are gone; this module decides when they go.

- A runtime file is routed when the host is known to have a CUDA driver by the time the
  file is first probed (a libcuda among the well-known files, or mapped by a process
  found so far): its launch entries are then probed per process (RUNTIME_LAUNCHES), its
  other calls as any file's (RUNTIME_CALLS). A file probed before any driver was seen
  keeps its launch probes for every process: a launch that never reaches a driver (no
  GPU) is seen by the runtime's probe only, from the process's first call.
- A process that maps a routed runtime and the driver learns its kernels' handles: the
  learners (RUNTIME_LEARNERS) run beside the runtime's launch probes. Once it has paired
  one handle at least and paired no new one for `stable_s`, its runtime launch probes and
  learners are detached: once their links have closed (confirm_detached, every loop, logs
  `at_driver_line` then), each launch is one run of the driver's probe.
- A launch the driver counts with a handle that has no pair (a kernel first launched
  after the detach) carries the handle, named from what the handle probes learned where
  they saw it, and brings the process's runtime probes back to learn it; `stable_s`
  doubles each time, up to STABLE_MAX_S.
- Graph launches need no pair (the exec is the same handle for both): once one of the
  process's runtime graph launches is seen reaching the driver's probe while it learns,
  its runtime graph launch probes (RUNTIME_GRAPH_LAUNCHES) go at the next review, and
  stay gone (confirm_detached logs `graphs_at_driver_line`). Its kernel launch probes
  stay until its kernels are paired: a graph launch reaching the driver proves nothing
  of the path its kernel launches take (they might reach it by an entry no probe is on,
  and be lost once the runtime's probes go). So a process that launches graphs only is
  at one program run a graph launch too.
- A process that maps no driver keeps its runtime launch probes: its launches reach no
  driver probe. So does one whose learners kept UNREACHED_LAUNCHES funcs with no pair
  made: its runtime's launches do not reach the driver's probed entries (its learners go,
  and its runtime probes count its launches as elsewhere)."""
from __future__ import annotations

import ctypes as ct
import logging
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable

from ..cuda_calls import DRIVER, RUNTIME, RUNTIME_CALLS, RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS

log = logging.getLogger(__name__)

STABLE_S = 2.0       # no new pair this long (one at least): the runtime's launch probes go
STABLE_MAX_S = 60.0  # the wait doubles at each return of the probes, up to this
UNREACHED_LAUNCHES = 10_000  # launches learnt from with no pair made: the driver's probe never sees them


def at_driver_line(pid: int) -> str:
    """The start of the line logged when pid's runtime launch probes go (the bench and the
    tests wait for it)."""
    return f"pid {pid}: its runtime launches are counted at the driver"


def graphs_at_driver_line(pid: int) -> str:
    """The start of the line logged when pid's runtime graph launch probes go."""
    return f"pid {pid}: its runtime graph launches are counted at the driver"


@dataclass
class _Process:
    runtimes: list        # its routed runtime files (ProbeTargets of kind RUNTIME)
    driver: bool          # it maps the driver (and its runtime's launches are not known to miss it)
    since: float          # when its pairs last changed, or its learning started
    attached: bool = True  # its runtime launch probes (and, with the driver, learners)
    paired: int = 0        # launch_routes' counts when last read
    unpaired: int = 0
    stable_s: float = STABLE_S
    unreached: bool = False  # its runtime's launches never reached the driver's probe
    closing: int = 0  # runtime probes detached whose links may still run (probes/closer.py)
    graphs_attached: bool = True  # its runtime graph launch probes (gone for good once proven)
    closing_graphs: int = 0  # as `closing`, for those alone


@dataclass
class LaunchRoutes:
    attacher: object          # probes/attacher.py Attacher
    table: object             # the kernel's `launch_routes` (pid -> paired, unpaired, kept)
    pairs: object = None      # the kernel's `launch_pairs` ((pid, handle) -> func)
    learning: object = None   # the kernel's `launch_learning` (pid -> 1 while its learners are attached)
    cache: object = None      # the kernel's `launch_pair_cache`, as a kernel_io BatchMap (slot -> a pair)
    clock: Callable[[], float] = time.monotonic
    driver_seen: bool = False
    files: dict = field(default_factory=dict)       # runtime file key -> routed, decided at first sight
    processes: dict = field(default_factory=dict)   # pid -> _Process
    taught: set = field(default_factory=set)  # pids whose learners were ever on: only theirs made pairs
    closing: bool = False     # a process's detached links may still run: confirm_detached() looks

    def saw(self, targets: Iterable) -> None:
        """Files found (a scan, the well-known files): a driver among them routes every
        runtime file first probed from now on."""
        if not self.driver_seen and any(t.kind == DRIVER for t in targets):
            self.driver_seen = True
            log.info("a CUDA driver is on this host: runtime launch probes are per process, and go once "
                     "the driver's probe can count their launches alone")

    def routed(self, target) -> bool:
        return target.kind == RUNTIME and self.files.setdefault(target.key, self.driver_seen)

    def calls_of(self, target):
        """The target to probe for every process (or per process with --pid): a routed
        runtime file's calls but its launches; any other file as it is."""
        return replace(target, kind=RUNTIME_CALLS) if self.routed(target) else target

    def see(self, pid: int, targets: list) -> int:
        """pid's files at a scan: its routed runtimes get their launch probes for it, and
        learners where it maps the driver, unless they were detached. Returns probes added."""
        runtimes = [t for t in targets if self.routed(t)]
        if not runtimes:
            return 0
        driver = any(t.kind == DRIVER for t in targets)
        p = self.processes.get(pid)
        if p is None:
            p = self.processes[pid] = _Process(runtimes, driver, self.clock())
        elif driver and not p.driver and not p.unreached:
            p.since = self.clock()  # its learning starts now
        p.runtimes, p.driver = runtimes, driver and not p.unreached
        return self._attach(pid, p) if p.attached else 0

    def review(self) -> None:
        """Reads each learning or detached process's counts: detaches, or brings back,
        its runtime launch probes."""
        now = self.clock()
        for pid, p in list(self.processes.items()):
            if not p.driver:
                continue
            r = self.table.get(ct.c_uint32(pid))
            paired, unpaired, kept, graphs = (r.paired, r.unpaired, r.kept, r.graphs) if r is not None else (0,) * 4
            if not paired and kept >= UNREACHED_LAUNCHES:
                p.driver, p.unreached = False, True
                self._learn(pid, False)
                n = sum(self.attacher.detach_target(_part(t, RUNTIME_LEARNERS).key, pid) for t in p.runtimes)
                log.info("pid %d: %d runtime launches and none reached the driver's probed entries: its runtime "
                         "launch probes count them (%d learners detached)", pid, kept, n)
                continue
            if paired != p.paired:
                p.paired, p.since = paired, now
            if p.attached and paired and now - p.since >= p.stable_s:
                p.attached, p.closing = False, self._detach(pid, p)
                self.closing = True
            elif p.attached and p.graphs_attached and graphs:
                p.graphs_attached = False
                p.closing_graphs = sum(self.attacher.detach_target(_part(t, RUNTIME_GRAPH_LAUNCHES).key, pid)
                                       for t in p.runtimes)
                self.closing = True
            elif not p.attached and unpaired != p.unpaired:
                p.attached, p.since, p.closing = True, now, 0
                p.stable_s = min(STABLE_MAX_S, p.stable_s * 2)
                log.info("pid %d: a kernel launched with no paired handle: its runtime launch probes are back "
                         "to learn it (%d probes)", pid, self._attach(pid, p))
            p.unpaired = unpaired

    def confirm_detached(self) -> None:
        """Called every loop: once the links detached by review() have closed (their
        programs run no more), their processes are at the driver alone, and logged so."""
        closing = ([(pid, p) for pid, p in self.processes.items() if p.closing or p.closing_graphs]
                   if self.closing else ())
        if not closing or not self.attacher.links_closed():
            return
        for pid, p in closing:
            if p.closing_graphs:
                log.info("%s from now on (%d runtime probes detached)", graphs_at_driver_line(pid), p.closing_graphs)
            if p.closing:
                log.info("%s from now on (%d kernel handles paired; %d runtime probes detached)",
                         at_driver_line(pid), p.paired, p.closing)
            p.closing = p.closing_graphs = 0
        self.closing = False

    def forget(self, pid: int) -> None:
        """pid's probes were detached with the rest of its own (it exited, or left)."""
        self.processes.pop(pid, None)

    def exited(self, pids: set) -> None:
        """Processes gone (their last records read): their entries, and their kernels'
        pairs and cache slots, which must not name the launches of a process given the
        same pid. Only a process that learned has any: the tables are read for those."""
        for pid in pids:
            self.forget(pid)  # one at the driver has no probe of its own for detach() to forget
        taught = pids & self.taught
        if not taught:
            return
        self.taught -= taught
        for k in [k for k in self.pairs.keys() if k.tgid in taught] if self.pairs is not None else ():
            try:
                del self.pairs[k]
            except KeyError:
                pass
        for slot, pair in self.cache.items() if self.cache is not None else ():  # a slot may outlive its pair
            if pair.tgid in taught:
                self.cache.table[slot] = self.cache.Leaf()

    def state(self) -> dict:
        """For `otel-gpu status`: processes counting their runtime launches at the driver,
        and those whose runtime launch probes are attached."""
        at_driver = sum(1 for p in self.processes.values() if not p.attached and not p.closing)
        return {"at_driver": at_driver, "at_runtime": len(self.processes) - at_driver}

    def _attach(self, pid: int, p: _Process) -> int:
        n = 0
        if p.driver:
            self._learn(pid, True)
        for t in p.runtimes:
            # Learners first: a launch their program missed is only a pair not learned.
            for kind in (RUNTIME_LEARNERS,) * p.driver + (RUNTIME_LAUNCHES,) + (RUNTIME_GRAPH_LAUNCHES,) * p.graphs_attached:
                n += self.attacher.attach(_part(t, kind), pid)
        return n

    def _detach(self, pid: int, p: _Process) -> int:
        self._learn(pid, False)
        p.graphs_attached = False  # its kernels reach the driver: its graphs are taken to as well
        return sum(self.attacher.detach_target(_part(t, kind).key, pid)
                   for t in p.runtimes for kind in (RUNTIME_LAUNCHES, RUNTIME_GRAPH_LAUNCHES, RUNTIME_LEARNERS))

    def _learn(self, pid: int, on: bool) -> None:
        """pid's `launch_learning` entry: set before its learners attach, gone before they
        detach (bpf/launch_routes.c)."""
        if on:
            self.taught.add(pid)
        if self.learning is None:
            return
        key = ct.c_uint32(pid)
        if on:
            self.learning[key] = ct.c_uint8(1)
        else:
            self.learning.pop(key, None)


def _part(target, kind: str):
    """One kind of a runtime file's rows, attached under a key of its own."""
    return replace(target, kind=kind, key=(*target.key, kind))
