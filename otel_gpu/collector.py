"""The running collector: it owns the BPF program (kernel_io/program.py), polls it for
records and pushes them through the stages wiring.py builds, scans /proc for new CUDA
processes (and the HTTP servers related to them, whose requests their GPU work may
serve: pipeline/groups.py), and at each flush interval pushes the kernel's rollups and a
Tick. It stops within --shutdown-timeout, every stage flushed or its losses counted."""
from __future__ import annotations

import logging
import time
from concurrent.futures import Future
from pathlib import Path
from typing import Optional

from . import proc
from .config import Config
from .device_clock.flag import lower_flag, raise_flag
from .probes.discovery import Discovery
from .probes.python import THREADS_WALKED, thread_states
from .ratelimit import Stats, split_drops
from .connection_seeding import ConnectionSeeding
from .records import DeviceClockSeen, ProcessGone, ProcessSeen, Tick
from .signal_flag import SignalFlag
from .status.writer import StatusWriter
from .wiring import build_pipeline

log = logging.getLogger("otel_gpu")
# A process that loaded or opened a CUDA library (bpf/library_probes.c) is scanned at
# once, and again every SETTLE_EVERY_S until it maps a file of each kind it opened (an open
# comes before the loader's mmap; a CUDA process opening the device-clock library is one
# already), SETTLE_S at most (a process that only read the file: a copy, ldconfig).
SETTLE_S, SETTLE_EVERY_S = 1.0, 0.02
# The loop's longest sleep with nothing to read: how late a stop, a SIGUSR1 or a program
# install (the head and HTTP/2 programs, once verified) can be seen.
POLL_MAX_S = 0.5
# Records wake the loop at most this often: a busy service's records are read and pushed
# through the pipeline in batches, not one wake-up and one pass of every stage a record.
# Not while a process that opened a CUDA library is being settled (SETTLE_EVERY_S).
POLL_EVERY_S = 0.05
EXIT_MARGIN_S = 0.5  # of --shutdown-timeout, kept for the last log line and the interpreter's exit
# The stages' closes give up at the deadline, then count what they could not deliver:
# waited for this much longer (within EXIT_MARGIN_S), so the `stopped:` line has the counts.
SETTLE_COUNTS_S = 0.25


class Collector:
    def __init__(self, config: Config, k8s=None, stats: Optional[Stats] = None) -> None:
        self.config = config
        self.stats = stats or Stats()  # one set of counters for the whole collector
        self.wiring = build_pipeline(config, self.stats, k8s)
        self.pipeline = self.wiring.pipeline
        self.groups = self.wiring.groups
        self.discovery = Discovery(config.proc_root, None if config.trace_all else self._wanted,
                                   groups=self.groups, execed=self._execed)
        self.program = None  # probes.program.BpfProgram, once started
        self._traced_pids: set[int] = set()
        self._device_clock: set[int] = set()  # processes mapping the device-clock library (DeviceClockSeen)
        # HTTP servers traced for a related CUDA process (until they exit), and which
        # server each CUDA process follows (BpfProgram.follow).
        self._servers: set[int] = set()
        self._follows: dict[int, Optional[int]] = {}
        self.state_requested = SignalFlag()  # SIGUSR1 (cli.py)
        # pid -> (until when it is scanned again (SETTLE_S), the kinds of file it opened)
        self._settling: dict[int, tuple[float, frozenset]] = {}
        self._next_settle = 0.0
        self.seeding = ConnectionSeeding(lambda: self.program.connections, config.proc_root, config.max_connections,
                                         self.stats)
        # The bound the kernel samples heads by once an unsampled parent is seen (the default
        # sampler: pipeline/sampling.py bound_once_parents_unsampled); None: nothing deferred.
        self._heads_deferred = self.wiring.sampling.deferred_bound
        self.status = StatusWriter(config.status_file, self.stats) if config.status_file else None

    def _execed(self) -> Optional[set]:
        """Processes that called exec since the last full scan; None before the program runs."""
        return self.program.execed_pids() if self.program is not None else None

    def _wanted(self, pid: int) -> bool:
        if pid in self.config.pids:
            return True
        if self.config.exes:
            comm, exe = proc.comm(self.config.proc_root, pid), proc.exe(self.config.proc_root, pid)
            name = Path(exe.removesuffix(proc.DELETED)).name if exe else None
            return comm in self.config.exes or name in self.config.exes
        return False

    def start(self, loading: Optional[Future] = None) -> None:
        """`loading`: the BPF program's load, started ahead (kernel_io/program.py
        start_loading, with this collector's config and stats); else it loads here."""
        from .kernel_io.program import load_program
        t0 = time.monotonic()
        self.program = loading.result() if loading is not None else load_program(self.config, self.stats)
        self._probe_known_files()
        self._scan()
        # Still `ready` first (the health file and tests wait for it), but never silently
        # without a launch probe: its processes' kernels would all go uncounted.
        missing = self.program.missing_launches()
        for symbol, path, error in missing:
            log.warning("%s not attached in %s: %s; launches through it are not counted until a "
                        "retry attaches it", symbol, path, error)
        degraded = "; ".join(f"{s} not attached in {p}: {e}" for s, p, e in missing)
        log.info("ready%s: %s (%.1f s); spans to %s", f" (DEGRADED: {degraded})" if missing else "",
                 self.program.describe(), time.monotonic() - t0,
                 ", ".join(self.wiring.destinations.names) or "nowhere")
        if self.config.health_file:
            Path(self.config.health_file).write_text("ready\n")
        if self.config.device_clock_flag:  # the probes on the library's hand-off are in place
            raise_flag(self.config.device_clock_flag)
        # After `ready`: verifying the head programs takes ~1.3 s on a small VM, and until
        # they run the collector decides every request itself, as it can.
        self.program.sample_heads(self.wiring.sampling.kernel_bound, self.wiring.sampling.parents)

    def _sample_heads_by_parents(self) -> None:
        """The first unsampled parent under a sampler that samples every root: from now on
        the kernel decides each head (every root sampled, a canonical parent by its flag),
        so such requests' calls are counted, not streamed. Loaded only now: a service no
        unsampled parent reaches never pays the programs' verification (~1.3 s) or their
        run per request. Verified beside the poll loop, which goes on meanwhile: traffic is
        flowing, and until they run the collector decides as before."""
        bound, self._heads_deferred = self._heads_deferred, None
        log.info("an incoming traceparent is not sampled: the kernel decides each request's sampling "
                 "from now on")
        self.wiring.stitcher.http.kernel_bound = bound
        self.program.sample_heads(bound, True, wait=False)

    def _probe_known_files(self) -> None:
        """Probes the well-known CUDA library files before any process maps them
        (default mode: every call; with --pid/--exe: only the load probe), so a process
        that starts later is traced from its library load, not from the next scan."""
        import sys

        from .probes.discovery import known_library_files
        root = proc.path(self.config.proc_root, 1, "root")
        files = known_library_files(root if self.config.proc_root != "/proc" else "",
                                    [p for p in sys.path if p.endswith("-packages")])
        t0 = time.monotonic()
        routes = self.program.launch_routes
        routes.saw(files)
        for target in files:
            self.program.attach_load_probe(target)
            if self.config.trace_all:
                self.program.attach(routes.calls_of(target))
        log.info("%d CUDA library files probed ahead of any process (%.2f s)", len(files), time.monotonic() - t0)

    def _python_threads(self, pid: int, found, new: bool = False) -> dict:
        threads = thread_states(proc.path(self.config.proc_root, pid, "mem"), found)
        if threads is None and new:
            log.info("pid %d: its interpreter's thread list cannot be read; the Python contexts of "
                     "threads older than the newest %d stay unknown", pid, THREADS_WALKED)
        return threads or {}

    def _scan(self, only: Optional[set] = None) -> dict:
        """All of /proc, or only the processes `only` (they just loaded or opened a CUDA
        library); returns the CUDA processes found, each with the files it maps (targets)."""
        from .cuda_calls import DEVICE_CLOCK, GO, PYTHON
        from .probes.rows import CALL_LIBRARIES
        found = self.discovery.scan(only)
        python = found.python if self.config.python_context else {}
        go = found.go if self.config.go_goroutines else {}
        optional = {PYTHON: self.config.python_context, GO: self.config.go_goroutines}
        # Default: one probe set per CUDA library file, for every process mapping it. With
        # --pid/--exe: per selected process, so the other processes mapping the same file
        # never trap. The interpreter and Go runtime probes are always per process: only
        # the CUDA processes pay for them, not every Python or Go program on the host.
        # A routed runtime's launch entries are per process in both modes (launch_routes.py).
        routes = self.program.launch_routes
        routes.saw(found.targets)
        wanted = [(pid, routes.calls_of(t)) for pid, targets in found.by_pid.items() for t in targets
                  if not self.config.trace_all or t.kind in optional]
        wanted += [(None, routes.calls_of(t)) for t in found.targets if t.kind not in optional] \
            if self.config.trace_all else []
        self.program.set_runtime_text(found.runtime_text)  # before any new pid is traced: exact from its first scan
        new = found.cuda_pids - self._traced_pids
        for pid in new:  # before its probes attach (~0.3 s): its HTTP is seen from now
            self._trace(pid)
            self._follows.pop(pid, None)  # trace() reset it
        late = set()  # new processes whose CUDA probes attach only now
        for pid, targets in found.by_pid.items():  # a routed runtime's launches: before its other calls
            if routes.see(pid, targets):
                late |= {pid} & new
        for pid, target in wanted:
            if target.kind not in optional and self.program.attach(target, pid) and target.kind in CALL_LIBRARIES:
                late |= {pid} & new if pid is not None else \
                    {p for p in new if any(t.key == target.key for t in found.by_pid.get(p, ()))}
        probes_from_ns = time.monotonic_ns()  # the BPF clock: their calls before this were not seen
        for pid, target in wanted:  # the interpreter and Go runtime probes: after the CUDA ones
            if target.kind in optional and optional[target.kind]:
                self.program.attach(target, pid)
        # Default mode: the next process loading a file seen here is traced at once. Not
        # with --pid/--exe: a file-wide probe would outlive the processes that brought it.
        for target in found.targets if self.config.trace_all else ():
            if target.kind not in optional:
                self.program.attach_load_probe(target)
        for pid in self.program.probed_pids() - found.cuda_pids if only is None else ():
            self.program.detach(pid, "exited, or no longer selected or mapping CUDA")
        for pid in python.keys() - new:  # threads made since: bpf/python_probes.c py_threads
            self.program.list_python_threads(pid, self._python_threads(pid, python[pid]))
        for pid in new:
            if pid in python:
                self.program.trace_python(pid, python[pid], self._python_threads(pid, python[pid], new=True))
            if pid in go:
                self.program.trace_go(pid, go[pid])
            units = " (Python contexts)" if pid in python else f" (goroutines, {go[pid].version})" if pid in go else ""
            log.info("tracing pid %d%s%s", pid, units, " as it loads CUDA" if only else "")
        servers = found.servers - found.cuda_pids - self._servers
        for pid in sorted(servers):
            self._trace(pid)
            log.info("tracing pid %d (HTTP server related to a traced GPU process)", pid)
        self._servers |= servers
        if servers:
            self.seeding.share(self._servers)
        self.groups.set_traced(found.cuda_pids | self._servers | (self._traced_pids if only else set()))
        if only is None:  # following needs every listening process: full scans only
            self._follow(found)
        new |= servers
        device_clock = {pid for pid, targets in found.by_pid.items() if any(t.kind == DEVICE_CLOCK for t in targets)}
        self._push([ProcessSeen(pid, probes_from_ns if pid in late else 0)  # read /proc while they surely live
                    for pid in sorted(new)]
                   + [DeviceClockSeen(pid) for pid in sorted(device_clock - self._device_clock)]
                   + self.seeding.seed(new))
        self._device_clock = device_clock if only is None else self._device_clock | device_clock
        self._traced_pids = found.cuda_pids if only is None else self._traced_pids | found.cuda_pids
        return found.by_pid

    def _trace(self, pid: int) -> None:
        self.program.trace(pid)
        if self.wiring.stitcher.s.quiet_when_idle:  # quiet from the start: its first requests too
            self.program.set_quiet({pid: True})

    def _settle(self) -> None:
        """Scans the processes that loaded or opened a CUDA library, until they map a file
        of each kind they opened (then its probes attach) or SETTLE_S has passed."""
        now = time.monotonic()
        for pid, opened in self.program.loaded_pids().items():  # each open: SETTLE_S to map it
            self._settling[pid] = (now + SETTLE_S, self._settling.get(pid, (0, frozenset()))[1] | opened)
        if not self._settling or now < self._next_settle:
            return
        self._next_settle = now + SETTLE_EVERY_S
        found = self._scan(set(self._settling))
        self._settling = {pid: (until, kinds) for pid, (until, kinds) in self._settling.items()
                          if (pid not in found or not kinds <= {t.kind for t in found[pid]}) and until > now}

    def _follow(self, found) -> None:
        """A CUDA process related to traced HTTP servers (one or several) streams its
        calls while they have HTTP activity (one) or always (several): its calls are
        then per-call records the stitcher can cut into batch steps."""
        from .kernel_io.program import FOLLOW_ALL
        listening = self._servers | found.listening
        for pid in found.cuda_pids:
            key = self.groups.key(pid)
            servers = sorted(s for s in listening if s != pid and self.groups.key(s) == key)
            follow = None if not servers else servers[0] if len(servers) == 1 else FOLLOW_ALL
            if self._follows.get(pid) != follow:
                self.program.follow(pid, follow)
                self._follows[pid] = follow
                if follow is not None:
                    log.info("pid %d: CUDA calls streamed while %s", pid,
                             f"pid {follow} has HTTP activity" if follow != FOLLOW_ALL
                             else f"related HTTP servers run ({len(servers)})")

    def _push(self, batch: list) -> None:
        """One batch through the pipeline; then the program forgets processes that left."""
        out = self.pipeline.push(batch)
        if self._heads_deferred is not None and self.wiring.stitcher.http.unsampled_parent_seen:
            self._sample_heads_by_parents()
        if self.wiring.stitcher.http.quiet:  # processes whose open requests became all unsampled, or not
            self.program.set_quiet(self.wiring.stitcher.http.quiet)
            self.wiring.stitcher.http.quiet = {}
        gone = {r.tgid for r in out if type(r) is ProcessGone}
        if gone:
            self.program.forget(gone)
            for pid in gone:
                self.wiring.ports.forget(pid)
            self.groups.forget(gone)
            self._traced_pids -= gone
            self.seeding.forget(gone)
            if gone & self._servers:
                self._servers -= gone
                self.seeding.share(self._servers)  # the others' shares grow
            for pid in gone:
                self._follows.pop(pid, None)

    def run(self, stop) -> None:
        """Until stop.is_set() (a SignalFlag, or a threading.Event set by another thread)."""
        next_scan = next_flush = time.monotonic()
        read_ns = 0
        while not stop.is_set():
            # The ring read at most every POLL_EVERY_S, the wait before the read, never between
            # it and the flush: a Tick says the records made before its time were read
            # (pipeline/steps.py decides batch steps by it).
            rest = read_ns / 1e9 + POLL_EVERY_S - time.monotonic()
            if rest > 0 and not self.program.ring.full and not self._settling:
                time.sleep(rest)
            # Woken by records (a library load sends one: bpf/library_probes.c), else at the
            # next scan or flush, POLL_MAX_S at most: an idle node's collector sleeps.
            wait = SETTLE_EVERY_S if self._settling else min(POLL_MAX_S, next_scan - time.monotonic(),
                                                               next_flush - time.monotonic())
            batch = self.program.poll(max(0, int(wait * 1000)))
            read_ns = time.monotonic_ns()  # the records made before this were read (unless the batch was full)
            self._push(batch)
            self._settle()
            self.program.launch_routes.confirm_detached()
            now = time.monotonic()
            if now >= next_scan:
                self._scan()
                next_scan = now + self.config.scan_interval_s
            if now >= next_flush:
                self.program.launch_routes.review()
                self._push(self.program.read_rollups() + self.seeding.at_flush(self._traced_pids | self._servers)
                           + [self.program.probe_counts(), Tick(read_ns)])
                next_flush = now + self.config.flush_interval_s
            if self.state_requested.is_set():
                self.state_requested.clear()
                self._push(self.program.poll(0))  # as of the signal: drain first
                log.info("%s", self.state())
            if self.status is not None:
                self.status.tick(self)  # `otel-gpu status` reads it

    def shutdown(self) -> None:
        """Stop the probes, drain what they left and close open requests; then the
        exporters flush while the probes' events close. Stopping them first leaves no
        record or count between the last read and the detach. The flush ends within
        config.shutdown_timeout_s whatever the backend does; what OTLP has not delivered
        by then is counted (spans_dropped_shutdown, metrics_dropped_shutdown). The probes'
        closes, started with stop_probes(), are waited for until the same deadline."""
        deadline = time.monotonic() + self.config.shutdown_timeout_s - EXIT_MARGIN_S
        if self.config.device_clock_flag:
            lower_flag(self.config.device_clock_flag)
        try:
            if self.program is not None:
                self.program.stop_probes()
                self._drain(time.monotonic() + (deadline - time.monotonic()) / 2)
                self._push(self.program.read_rollups(final=True) + [Tick(time.monotonic_ns(), final=True)])
        finally:
            from .export.bounded import wait_by
            closing = self.pipeline.start_close(deadline)
            try:
                if self.program is not None:
                    t0 = time.monotonic()
                    self.program.close(max(0.0, deadline - t0))
                    log.info("probes detached (%.1f s)", time.monotonic() - t0)
            finally:
                wait_by(deadline + SETTLE_COUNTS_S, closing)
            if self.config.health_file:
                Path(self.config.health_file).unlink(missing_ok=True)
            if self.status is not None:
                self.status.final(self)  # `otel-gpu status` then says it stopped, with its last counts
        log.info("stopped: %s", self.summary())
        log.info("CUDA calls by attribution rule (pipeline/rules.py): %s",
                 " ".join(f"{k}={v}" for k, v in self.wiring.stitcher.by_rule.items() if v) or "none")

    def _drain(self, by: float) -> None:
        """Read the ring buffer until it is empty: a consumer behind its load holds many
        batches, whose HTTP records end requests (closing them without those records would
        misplace the calls counted for them). Half the shutdown budget at most; records
        still unread then are not seen: logged and counted."""
        while True:
            batch = self.program.poll(0)
            if not batch:
                return
            self._push(batch)
            if time.monotonic() >= by:
                self.stats.add("ring_undrained_shutdown")
                log.warning("stopping with records still in the ring buffer (--shutdown-timeout %s s): "
                            "requests they would have ended are closed as incomplete",
                            self.config.shutdown_timeout_s)
                return

    def traced_processes(self) -> dict[int, str]:
        """pid -> why it is traced: "cuda" (maps a CUDA library) or "http-server" (related to one)."""
        return {**{pid: "http-server" for pid in self._servers}, **{pid: "cuda" for pid in self._traced_pids}}

    def state(self) -> str:
        """Sizes of every table that must return to baseline when processes go away."""
        sizes = {**(self.program.state() if self.program is not None else {}), **self.pipeline.state()}
        return "state: " + " ".join(f"{k}={v}" for k, v in sizes.items())

    def summary(self) -> str:
        s = self.stats.snapshot()
        a = self.wiring.stitcher.attributed
        drops, counted = split_drops(s)

        def pairs(d: dict) -> str:
            return ", ".join(f"{k}={v}" for k, v in d.items()) or "none"
        return (f"{s.get('requests_finished', 0)} requests, {self.wiring.destinations.spans_out} spans; CUDA calls by "
                f"attribution: {' '.join(f'{k}={v}' for k, v in a.items())}; dropped: {pairs(drops)}; "
                f"counted: {pairs(counted)}")
