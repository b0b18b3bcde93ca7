"""The one owner of the loaded BPF program: it loads it, attaches the CUDA probes to
the files discovery finds, hands the pipeline its records (ring buffer and rollup
map), marks processes traced, drops the map entries of processes that exited, and
reports its tables' sizes. Map names and key layouts are spelled here and in bpf/
only."""
from __future__ import annotations

import ctypes as ct
import itertools
import logging
import time
from concurrent.futures import Future, ThreadPoolExecutor
from typing import Optional

from ..cuda_calls import DEVICE_CLOCK, DRIVER, HIP, NCCL, RUNTIME, TLS
from ..probes import compiler_memory, pid_bits, runtime_text, uprobe_links
from ..probes.attacher import Attacher
from ..probes.launch_routes import LaunchRoutes
from ..probes.discovery import ProbeTarget
from ..probes.source import ProgramOptions, load
from ..ratelimit import Stats
from . import launch_slots
from .abi import LIB_CUDART, LIB_DEVICE_CLOCK, LIB_DRIVER, LIB_HIP, LIB_NCCL, LIB_SSL, GoProc, PyProc, PyThreadKey
from .connection_table import ConnectionTable
from .count_collector import CountCollector
from .kernel_counters import KernelCounters
from .map_batch import BatchMap
from .reader import AggregateReader, RingReader, RollupReader
from .request_summaries import SummaryReader

log = logging.getLogger(__name__)

# Maps keyed by tgid, and maps keyed by pid_tgid (tgid in the high 32 bits) or by a
# struct with a tgid field: every entry of an exited process goes.
_BY_TGID = ("traced", "http_active", "http_seq", "py_procs", "go_procs", "runtime_text", "capture_procs",
            "quiet_procs", "conn_shares", "req_summaries", "launch_routes", "launch_learning")
_BY_PID_TGID = ("in_call", "py_tstate", "tls_calls", "tls_last_read")
_STATE_TABLES = ("traced", "http_active", "conns", "rollup", "req_agg", "in_call", "py_procs", "py_tstate",
                 "py_threads")
# `traced` values (bpf/maps.h): traced, following no server; every related server.
TRACED, FOLLOW_ALL = 1, 0xFFFFFFFF
# The `loaded` table is read when a LibraryLoaded cue says it has news, and this often all the
# same: a cue lost with a full ring waits no longer.
LOADED_RECHECK_S = 2.0
# The `loaded` table's bits (abi.LIB_*): the kind of file discovery finds once it is mapped.
OPENED_KINDS = {LIB_CUDART: RUNTIME, LIB_DRIVER: DRIVER, LIB_NCCL: NCCL, LIB_HIP: HIP,
                LIB_DEVICE_CLOCK: DEVICE_CLOCK, LIB_SSL: TLS}
HEAD_PROGRAMS = (b"head_scan", b"head_parent")  # bpf/head_sampling.c, in head_scans' order
H2_PROGRAMS = (b"h2_walk",)  # bpf/h2_walk.c, in h2_walkers


def load_program(config, stats: Stats) -> "BpfProgram":
    """The BpfProgram of `config`: maps, the verifier, or a clang compile where the BPF
    cache does not hold it."""
    return BpfProgram(ProgramOptions.from_config(config), stats)


def start_loading(config, stats: Stats) -> Future:
    """load_program on a thread of its own: `otel-gpu run` starts it before it imports the
    pipeline's modules (the OTel SDK and gRPC, ~0.3 s), which are imported beside it, as
    the load mostly waits in syscalls and libbcc with the GIL let go. Nothing else
    touches bcc until the collector's start takes the result."""
    pool = ThreadPoolExecutor(1, thread_name_prefix="bpf-program")
    loading = pool.submit(load_program, config, stats)
    pool.shutdown(wait=False)  # its thread ends with the load
    return loading


def discard(loading: Future, timeout: float = 10) -> None:
    """A load started ahead that no collector will take (it could not be made): waited
    for and closed before the caller returns. Left running into the interpreter's exit,
    it could start no threads there (its programs' parallel verification) and ended in a
    compile that nothing would use."""
    try:
        program = loading.result()
    except Exception:  # its own failure is of no interest now
        return
    program.close(timeout)


class BpfProgram:
    _h2_walk_verifying = False  # h2_walk is being verified beside the attach (_start_h2_walk)

    def __init__(self, options: ProgramOptions, stats: Stats) -> None:
        self.stats = stats
        t0 = time.monotonic()
        self.bpf = load(options, stats)  # from the BPF cache when it holds this program
        self.load_s = time.monotonic() - t0  # the clang compile and the verifier: most of `ready`
        dropped_kb = compiler_memory.release()
        from ..probes.cached_bpf import CachedBPF  # imports bcc, which load() already needed
        how = "from the cache" if isinstance(self.bpf, CachedBPF) else "compiled"
        log.info("BPF program loaded (%.1f s, %s); %d MB of compiler pages released", self.load_s, how,
                 dropped_kb // 1024)
        self._h2_walk_verifying = self._start_h2_walk()
        self.ring = RingReader(self.bpf, "events", stats, size=options.map_sizes()["events"])
        self._loaded_recheck = 0.0  # when loaded_pids reads the table without a cue
        self.pid_bits = pid_bits.PidBits(self.bpf["pid_bits"], options.pid_words)
        self.rollups = RollupReader(self.bpf["rollup"],
                                    launch_slots.reader(self.bpf, options.cpus, self.pid_bits.traced.__contains__))
        self.summaries = SummaryReader(self.bpf["req_summaries"])
        self._late_summaries: list = []  # read at a process's exit, before its entry went
        self.kernel_counters = KernelCounters(self.bpf["counters"], stats)
        self.aggregates = AggregateReader(BatchMap(self.bpf["req_agg"], "req_agg"), stats,
                                          counted=lambda: self.kernel_counters.total("aggregated"),
                                          kernel_epoch=self._kernel_epoch)
        self.collector = CountCollector(self.aggregates)  # req_agg's ended counts, while a batch is worked through
        self.connections = ConnectionTable(self.bpf)
        self.attacher = Attacher(self.bpf, stats, uprobes=uprobe_links.choose(self.bpf, options.uprobe_links))
        self.launch_routes = LaunchRoutes(self.attacher, self.bpf["launch_routes"], self.bpf["launch_pairs"],
                                          self.bpf["launch_learning"],
                                          BatchMap(self.bpf["launch_pair_cache"], "launch_pair_cache"))
        self._runtime_text: dict = {}  # pid -> its runtime code ranges, as written to `runtime_text`
        self._py_threads: dict = {}  # pid -> {thread: state} as written to `py_threads`
        self._verdict_gens = itertools.count(1)  # next() is atomic: callers on several threads
        self._heads_verifying: Optional[tuple] = None  # (bound, parents, t0) of sample_heads(wait=False)

    def _kernel_epoch(self, tgid: int) -> Optional[int]:
        """The process's HTTP epoch in the kernel now (http_seq), or None (no entry)."""
        seq = self.bpf["http_seq"].get(ct.c_uint32(tgid))
        return None if seq is None else seq.epoch

    def _start_h2_walk(self) -> bool:
        """bpf/h2_walk.c verified beside the probes' attach (~0.5 s of verifier), installed by
        the poll once it is (True), or installed now (False: bcc's own compiled module)."""
        from bcc import BPF  # imported late: the unit tier runs without bcc

        from ..probes.cached_bpf import load_ahead
        if load_ahead(self.bpf, H2_PROGRAMS, BPF.RAW_TRACEPOINT, beside=True):
            return True
        self._install_h2_walk()
        return False

    def _install_h2_walk(self) -> None:
        """h2_walk into h2_walkers, then switched on: HTTP/2 connections opened from now on
        have their frames walked by the kernel, past the probe's copy size."""
        from bcc import BPF  # imported late: the unit tier runs without bcc
        self._h2_walk_verifying = False
        try:
            self.bpf["h2_walkers"][ct.c_int(0)] = ct.c_int(self.bpf.load_func(H2_PROGRAMS[0], BPF.RAW_TRACEPOINT).fd)
        except Exception as e:  # a verifier elsewhere may refuse it: the probes' copy as before
            log.warning("HTTP/2 frames are not walked in the kernel (h2_walk did not load: %s): a connection "
                        "whose one read carries more frames than the probe copies is dropped", e)
            self.stats.add("h2_walk_unavailable")
            return
        self.bpf["h2_walk_on"][ct.c_int(0)] = ct.c_uint32(1)

    def _verdicts_changed(self) -> None:
        """After a change of `traced`, py_procs, go_procs or quiet_procs: each thread's
        standing verdict (bpf/request_counts.c) is decided again at its next call. Each
        value is written once, so no verdict can take an older one for its own."""
        self.bpf["verdict_gen"][ct.c_int(0)] = ct.c_uint32(next(self._verdict_gens) & 0xFFFFFFFF)

    # --- records for the pipeline ---------------------------------------------------
    def poll(self, timeout_ms: int) -> list:
        """Records from the ring buffer. Before a process's exit, the calls the kernel
        counted for it: its last KernelRollups go ahead of its ProcExit. The calls it
        counted per request (req_agg) go where their HTTP epoch ended."""
        if self._h2_walk_verifying and not self.bpf.loading(H2_PROGRAMS):
            self._install_h2_walk()
        if self._heads_verifying is not None and not self.bpf.loading(HEAD_PROGRAMS):
            self._install_heads(*self._heads_verifying)
        self.collector.idle()
        batch, first_exit = self.ring.poll(timeout_ms)
        if batch:
            self.aggregates.shedding = self.ring.half_full(time.monotonic_ns())
        if first_exit >= 0:
            batch[first_exit:first_exit] = self.rollups.read(time.monotonic_ns())
        batch = self.aggregates.merge(batch)
        if batch:
            self.collector.busy()  # the pipeline's now, until the next poll
        return batch

    def read_rollups(self, final: bool = False) -> list:
        """What the kernel counted since the last read (calls, and requests it summarised);
        also takes in lost events.
        `final` (the collector stops): every per-request count too."""
        self.kernel_counters.account()
        summaries, self._late_summaries = self._late_summaries + self.summaries.read(), []
        if summaries:  # requests whose records were lost: counted, not dropped
            self.stats.add("requests_summarised", sum(c for s in summaries for c, _ in s.buckets))
        rollups = self.rollups.read(time.monotonic_ns()) + summaries
        return self.aggregates.merge([], final=True) + rollups if final else rollups

    def counters(self) -> dict[str, int]:
        return self.kernel_counters.read()

    # --- probes and processes --------------------------------------------------------
    def attach(self, target: ProbeTarget, pid: Optional[int] = None) -> int:
        """Probes `target` for every process that maps it, or for `pid` only; again:
        retries its probes that failed, when their backoff is over."""
        return self.attacher.attach(target, pid)

    def probe_counts(self):
        """A ProbeCounts record for the metrics stage: attached and failed by function."""
        return self.attacher.counts()

    def missing_launches(self) -> list[tuple[str, str, str]]:
        """(symbol, file, error) of launch probes that failed to attach (retried at scans)."""
        return self.attacher.missing_launches()

    def attach_load_probe(self, target: ProbeTarget) -> bool:
        """Tells `loaded_pids` about every process that loads `target` from now on."""
        return self.attacher.attach_load_probe(target)

    def loaded_pids(self) -> dict[int, frozenset]:
        """Processes that loaded or opened a probed library since the table was last read
        (bpf/library_probes.c), each with the kinds of library it opened (discovery's: none
        where a probed library's initialiser told, mapped already): read when a
        LibraryLoaded cue came, and every LOADED_RECHECK_S all the same (a cue lost with a
        full ring)."""
        now = time.monotonic()
        if not self.ring.library_loaded and now < self._loaded_recheck:
            return {}
        self.ring.library_loaded, self._loaded_recheck = False, now + LOADED_RECHECK_S
        return {pid: frozenset(kind for bit, kind in OPENED_KINDS.items() if opened & bit)
                for pid, opened in self._take("loaded").items()}

    def execed_pids(self) -> set:
        """Processes that called exec since the last call (bpf/library_probes.c `execed`):
        discovery reads a quiet process's maps again only then."""
        return set(self._take("execed"))

    def _take(self, name: str) -> dict[int, int]:
        """pid -> value of pid table `name`, emptied."""
        table = self.bpf[name]
        taken = {}
        for k, v in list(table.items()):
            taken[k.value] = v.value
            try:
                del table[k]
            except KeyError:
                pass
        return taken

    def probed_pids(self) -> set:
        """Processes with probes of their own (--pid/--exe)."""
        return self.attacher.pids()

    def detach(self, pid: int, why: str) -> None:
        """Detaches process `pid`'s own probes; nothing is left in the kernel for it."""
        n = self.attacher.detach(pid)
        self.launch_routes.forget(pid)
        if n:
            log.info("detached %d CUDA probes of pid %d (%s)", n, pid, why)

    def set_runtime_text(self, by_pid: dict) -> None:
        """Each process's CUDA runtime code ranges (probes/runtime_text.py), where they
        changed: the driver launch probes drop the calls made from there (counted once,
        by the runtime probe)."""
        for pid, ranges in by_pid.items():
            if self._runtime_text.get(pid) != ranges:
                runtime_text.write(self.bpf["runtime_text"], pid, ranges)
                self._runtime_text[pid] = ranges

    def trace(self, pid: int) -> None:
        self.bpf["traced"][ct.c_uint32(pid)] = ct.c_uint32(TRACED)
        self.pid_bits.set(pid, pid_bits.TRACED)  # after the entry, clearing any SLOW
        self._verdicts_changed()

    def follow(self, pid: int, server: Optional[int]) -> None:
        """Traced process `pid` streams its CUDA calls while `server` (a related
        process: pipeline/groups.py) has HTTP activity, as well as while it has some
        itself; FOLLOW_ALL: always (several related servers); None: its own only.
        The kernel decides at each call, from the one `traced` lookup it makes anyway."""
        value = TRACED if server is None else FOLLOW_ALL if server <= TRACED else server
        if value != TRACED:  # SLOW before the value that needs it
            self.pid_bits.set(pid, pid_bits.TRACED | pid_bits.SLOW)
        self.bpf["traced"][ct.c_uint32(pid)] = ct.c_uint32(value)
        if value == TRACED:  # and cleared only after
            self.pid_bits.set(pid, pid_bits.TRACED)
        self._verdicts_changed()

    def trace_python(self, pid: int, found, threads: dict) -> None:
        """The process runs a known CPython (probes/python.PythonProcess): its CUDA and
        socket records carry `ctx` from now on. threads: its thread states now
        (python.thread_states), for list_python_threads."""
        self.bpf["py_procs"][ct.c_uint32(pid)] = PyProc.of(found)
        self._verdicts_changed()
        self.list_python_threads(pid, threads)

    def list_python_threads(self, pid: int, threads: dict) -> None:
        """pthread_self() -> PyThreadState* of each of the process's threads, as user space
        read them (bpf/python_probes.c py_threads): only what changed since the last list
        is written; the entries of threads gone go."""
        table, before = self.bpf["py_threads"], self._py_threads.get(pid, {})
        for thread in before.keys() - threads.keys():
            try:
                del table[PyThreadKey(pid, 0, thread)]
            except KeyError:
                pass
        for thread, state in threads.items():
            if before.get(thread) != state:
                table[PyThreadKey(pid, 0, thread)] = ct.c_uint64(state)
        self._py_threads[pid] = dict(threads)

    def trace_go(self, pid: int, binary) -> None:
        """The process is a Go executable (probes/go_runtime.GoBinary): its CUDA and socket
        records carry the running goroutine from now on."""
        lay = binary.layout
        self.bpf["go_procs"][ct.c_uint32(pid)] = GoProc(binary.tls_g, lay.g_m, lay.m_curg, lay.g_goid,
                                                        lay.g_parent_goid)
        self._verdicts_changed()

    def sample_heads(self, bound: Optional[int], parents: bool, wait: bool = True) -> None:
        """bpf/head_sampling.c: the kernel decides each request's sampling as its head is
        read: a root sampled when its draw < `bound` (pipeline/sampling.py kernel_bound),
        a canonical traceparent by its flag (`parents`: parentbased_*) or else by its trace
        id like a root; None: it decides none. Before the probes see requests: a head read
        earlier is not decided (its calls follow quiet_procs).
        Their verifier takes ~1 s. `wait=False` (they are wanted while requests flow): it
        runs beside the poll loop, which installs them once verified (poll), where the
        program can load ahead (probes/cached_bpf.py load_ahead); until then the collector
        decides."""
        if bound is None:
            return
        t0 = time.monotonic()
        if not wait:
            from bcc import BPF  # imported late: the unit tier runs without bcc

            from ..probes.cached_bpf import load_ahead
            if load_ahead(self.bpf, HEAD_PROGRAMS, BPF.RAW_TRACEPOINT, beside=True):
                self._heads_verifying = (bound, parents, t0)
                return
        self._install_heads(bound, parents, t0)

    def _install_heads(self, bound: int, parents: bool, t0: float) -> None:
        self._heads_verifying = None
        from bcc import BPF  # imported late: the unit tier runs without bcc
        scans = self.bpf["head_scans"]
        try:
            for i, name in enumerate(HEAD_PROGRAMS):  # HEAD_SCAN, HEAD_PARENT_PARSE
                scans[ct.c_int(i)] = ct.c_int(self.bpf.load_func(name, BPF.RAW_TRACEPOINT).fd)
        except Exception as e:  # a verifier elsewhere may refuse them: the collector decides alone
            log.warning("sampling is decided by the collector alone (the kernel's head programs did "
                        "not load: %s); unsampled requests' calls may be streamed", e)
            self.stats.add("head_sampling_unavailable")
            return
        table = self.bpf["head_settings"]
        leaf = table.Leaf()
        leaf.bound, leaf.on, leaf.parents = bound, 1, int(parents)
        table[table.Key(0)] = leaf
        log.info("sampling decided in the kernel as heads are read (programs verified in %.1f s)",
                 time.monotonic() - t0)

    def set_quiet(self, by_pid: dict) -> None:
        """pid -> True while every request it has open is unsampled (pipeline/sampling.py):
        the kernel then counts its calls instead of streaming them."""
        table, woken = self.bpf["quiet_procs"], False
        for pid, quiet in by_pid.items():
            if quiet:
                table[ct.c_uint32(pid)] = ct.c_uint8(1)
                continue
            try:
                del table[ct.c_uint32(pid)]
                woken = True
            except KeyError:
                pass
        if woken:  # its threads counting while it was quiet stream again
            self._verdicts_changed()

    def traced_count(self) -> int:
        return len(self.bpf["traced"])

    def forget(self, tgids: set) -> None:
        """Drops every entry of processes that exited (their last records have passed)."""
        if not tgids:
            return
        for tgid in tgids & self.attacher.pids():
            self.detach(tgid, "exited")
        self.rollups.forget(tgids)
        for tgid in tgids:
            self._runtime_text.pop(tgid, None)
        self.launch_routes.exited(tgids)
        self.aggregates.forget(tgids)
        self._late_summaries += self.summaries.read()
        self.summaries.forget(tgids)
        for name in _BY_TGID:
            table = self.bpf[name]
            for tgid in tgids:
                try:
                    del table[ct.c_uint32(tgid)]
                except KeyError:
                    pass
        for tgid in tgids:
            self.pid_bits.set(tgid, 0)
        self._verdicts_changed()  # a pid used again starts afresh
        # One pass per table whatever the number of exits: reading a map key by key is slow.
        for tgid in tgids:
            self._py_threads.pop(tgid, None)
        for name, tgid_of in [("conns", lambda k: k.tgid), ("h2_walks", lambda k: k.tgid),
                              ("req_agg", lambda k: k.tgid), ("ssl_fds", lambda k: k.tgid),
                              ("py_threads", lambda k: k.tgid),
                              ("stream_budget", lambda k: k.pid_tgid >> 32)] + [(n, lambda k: k.value >> 32) for n in _BY_PID_TGID]:
            table = self.bpf[name]
            for k in [k for k in table.keys() if tgid_of(k) in tgids]:
                try:
                    del table[k]
                except KeyError:
                    pass

    def tracepoints(self) -> int:
        """Tracepoints attached: perf events and raw ones (links)."""
        return self.bpf.num_open_tracepoints() + len(self.bpf.raw_tracepoint_fds)

    def describe(self) -> str:
        per_process = self.attacher.pids()
        return (f"{self.tracepoints()} tracepoints, {self.attacher.probe_count} CUDA probes "
                f"on {self.attacher.files()} files (attached in {self.attacher.attach_s:.3f} s, "
                f"{self.attacher.uprobes.name})"
                + (f" for {len(per_process)} processes only" if per_process else "")
                + f", {self.traced_count()} processes traced")

    def state(self) -> dict:
        # bpf.uprobes: what is held open (links or perf events); with --pid/--exe it returns
        # to its baseline as processes go.
        return {**{f"bpf.{name}": len(self.bpf[name]) for name in _STATE_TABLES},
                "bpf.uprobes": self.attacher.probe_count + self.attacher.closer.pending()}

    def stop_probes(self) -> None:
        """No probe records anything from now on; what they recorded stays readable
        (ring buffer, rollups) until close()."""
        self.attacher.disable_all()

    def close(self, timeout: float = 60) -> None:
        """Every probe detached (`timeout` at most for their closes), then the programs
        and maps freed."""
        self.collector.close()
        self.attacher.detach_all(timeout)
