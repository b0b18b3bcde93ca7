"""The BPF program's C text and how it is compiled and loaded with bcc.

The program is the generated CALL_* ids (cuda_calls.py c_defines()) followed by the
files of PROGRAM_FILES under bpf/, in that order (tls_probes.c sends OpenSSL plaintext
through http_probes.c's emit path; call_out.c is the way out for every CUDA call).
Tunables go in as -D cflags, never by editing the C text. Those that change no
instruction are kept out of them, so that another value is the same cached program: the
stream settings are written to a map after the load, and the table sizes are those of the
maps made from the cache's entry."""
from __future__ import annotations

import logging
import os
from dataclasses import dataclass, field
from pathlib import Path
from typing import Optional

from ..config import STREAM_RATE
from ..cuda_calls import c_defines
from . import kernel_btf, launch_slot_sizes, python, summary_buckets, syscalls
from .pid_bits import pid_words

log = logging.getLogger(__name__)

MERGED_HEADERS = Path("/var/lib/otel-gpu/kernel-headers")
PAGE_SIZE = 4096  # a ring buffer page (bpf/maps.h BPF_RINGBUF_OUTPUT)


def bpf_dir() -> Path:
    """bpf/ next to the package (source checkout or image), or OTEL_GPU_BPF_DIR."""
    env = os.environ.get("OTEL_GPU_BPF_DIR")
    if env:
        return Path(env)
    return Path(__file__).resolve().parents[2] / "bpf"


@dataclass(frozen=True)
class ProgramOptions:
    trace_all: bool = True      # False with --pid/--exe filters
    time_split: bool = False    # the sched tracepoint (bpf/sched_probes.c): from the config, on by default
    ringbuf_pages: int = 2048   # 8 MiB; a power of two
    max_procs: int = 4096
    max_conns: int = 65536
    stream_budget: int = 64     # CUDA calls streamed per thread and request (bpf/call_out.c stream_settings)
    stream_rate: int = STREAM_RATE  # CUDA calls streamed per second, host-wide (bpf/call_out.c stream_settings)
    bpf_cache: Optional[str] = None  # directory of compiled programs (probes/program_cache.py); None: compile
    pid_words: int = field(default_factory=pid_words)  # bpf/maps.h pid_bits: this host's pid_max / 32
    cpus: int = field(default_factory=launch_slot_sizes.possible_cpus)  # bpf/launch_slots.c: a block of slots per CPU
    task_fsbase: int = field(default_factory=lambda: kernel_btf.task_fsbase_offset() or -1)  # bpf/go_probes.c
    # offsetof(task_struct, pid), (tgid), (its state) and (sched_info.run_delay), for the time
    # split (bpf/sched_probes.c, thread_times.c); -1: no BTF, no time split
    task_offsets: tuple = field(default_factory=lambda: kernel_btf.task_time_offsets() or (-1, -1, -1, -1))
    # offsetof(task_struct, files), (files_struct, fdt), (fdtable, max_fds), (fdtable, fd), (file,
    # f_inode), (inode, i_ino): an fd's inode at accept's and close's exits (bpf/maps.h fd_ino);
    # -1: no BTF, a close is not checked
    fd_offsets: tuple = field(default_factory=lambda: kernel_btf.fd_table_offsets() or (-1,) * 6)
    uprobe_links: str = "auto"  # how uprobes are planted (probes/uprobe_links.py); not part of the program

    @classmethod
    def from_config(cls, config) -> "ProgramOptions":
        """What `otel-gpu run` and `otel-gpu compile` load: one program per config."""
        return cls(trace_all=config.trace_all, time_split=config.time_split, ringbuf_pages=config.ringbuf_pages,
                   max_conns=config.max_connections,
                   stream_budget=config.stream_budget, stream_rate=config.stream_rate, bpf_cache=config.bpf_cache,
                   uprobe_links=config.uprobe_links)

    def map_sizes(self) -> dict:
        """Max entries of the maps whose size is a setting, by map name: not part of the
        program (cflags), so that another size is the same cached program, its maps made
        at these sizes."""
        if self.ringbuf_pages <= 0 or self.ringbuf_pages & (self.ringbuf_pages - 1):
            raise ValueError("ringbuf_pages must be a power of two")
        return {"events": self.ringbuf_pages * PAGE_SIZE, "conns": self.max_conns, "ssl_fds": self.max_conns}

    def size_cflags(self) -> list[str]:
        """The sizes compiled in, where nothing is cached."""
        self.map_sizes()
        return [f"-DRINGBUF_PAGES={self.ringbuf_pages}", f"-DMAX_CONNS={self.max_conns}"]

    def cflags(self) -> list[str]:
        self.map_sizes()  # a bad size fails here, before any compile
        return [
            f"-I{bpf_dir()}",
            "-DOTEL_GPU_BPF=1",
            f"-DTRACE_ALL={int(self.trace_all)}",
            f"-DTIME_SPLIT={int(self.time_split)}",
            f"-DMAX_PROCS={self.max_procs}",
            f"-DPID_WORDS={self.pid_words}",
            f"-DLAUNCH_CPUS={self.cpus}",
            f"-DLAUNCH_SLOTS_LOG2={launch_slot_sizes.SLOTS_LOG2}",
            f"-DTASK_FSBASE_OFFSET={self.task_fsbase}",
            f"-DTASK_PID_OFFSET={self.task_offsets[0]}",
            f"-DTASK_TGID_OFFSET={self.task_offsets[1]}",
            f"-DTASK_STATE_OFFSET={self.task_offsets[2]}",
            f"-DTASK_RUN_DELAY_OFFSET={self.task_offsets[3]}",
            f"-DTASK_FILES_OFFSET={self.fd_offsets[0]}",
            f"-DFILES_FDT_OFFSET={self.fd_offsets[1]}",
            f"-DFDT_MAX_FDS_OFFSET={self.fd_offsets[2]}",
            f"-DFDT_FD_OFFSET={self.fd_offsets[3]}",
            f"-DFILE_INODE_OFFSET={self.fd_offsets[4]}",
            f"-DINODE_INO_OFFSET={self.fd_offsets[5]}",
            f"-DPY_TSTATE_NEXT={python.TSTATE_NEXT}",
            f"-DPY_THREADS_WALKED={python.THREADS_WALKED}",
            *summary_buckets.cflags(),
        ]


def release_headers() -> Path:
    """The running kernel's own header tree, where its headers package puts it."""
    return Path(f"/lib/modules/{os.uname().release}/build")


def kernel_headers_hint() -> None:
    """Point bcc at the merged header tree scripts/setup.sh builds when the running
    kernel ships none (bcc needs one directory; Debian splits it in two)."""
    if os.environ.get("BCC_KERNEL_SOURCE"):
        return
    if not release_headers().exists() and MERGED_HEADERS.is_dir():
        os.environ["BCC_KERNEL_SOURCE"] = str(MERGED_HEADERS)


def kernel_tree() -> Path:
    """The kernel header tree bcc compiles against (after kernel_headers_hint)."""
    return Path(os.environ.get("BCC_KERNEL_SOURCE") or release_headers())


# bcc rewrites map calls (`m.lookup()`) and generates tracepoint argument structs
# only in the main source text, never in #included files; so the program is these
# files joined. Their own `#include "maps.h"` lines are then no-ops (include guard).
# python_probes.c and go_probes.c define exec_unit(), which the HTTP and CUDA probes call.
PROGRAM_FILES = ("maps.h", "library_probes.c", "python_probes.c", "go_probes.c", "thread_times.c", "http_requests.c",
                 "head_sampling.c", "http_probes.c", "http_syscalls.c", "h2_walk.c", "tls_probes.c", "graph_capture.c", "launch_slots.c",
                 "request_counts.c", "call_out.c", "launch_routes.c", "cuda_probes.c", "kernel_handles.c", "graph_probes.c", "nccl_probes.c",
                 "hip_probes.c", "sched_probes.c", "device_records.c")


def source_text() -> str:
    """The C that is compiled (printed by `otel-gpu run --ebpf`): the call ids
    generated from the table, then the files."""
    return c_defines() + "\n".join((bpf_dir() / name).read_text() for name in PROGRAM_FILES)


def load(options: ProgramOptions, stats=None, compile_only: bool = False):
    """The bcc BPF object, from the cache when it holds this exact program, else
    compiled (and then cached), with its stream settings written and its syscall
    programs installed (probes/syscalls.py). bcc attaches the tracepoint functions itself (not with `compile_only`: `otel-gpu compile`
    warms the cache and attaches nothing); uprobes are the caller's. An unusable entry
    is logged, counted in `stats` as bpf_cache_invalid, and the program compiled."""
    bpf = _load(options, stats, compile_only)
    if not compile_only:
        write_stream_settings(bpf, options)
        syscalls.install(bpf)  # before any process is traced
    return bpf


# Calls stream one by one only while less than this share of the ring buffer is unread:
# a collector that falls behind gets counts, not records, until it has caught up, and the
# rest of the ring is kept for HTTP records (never counted away). At 3/4, a collector
# behind on item 2's load at 100 % sampling held 5.4 s of records; at 1/16, 2.5 s and a
# third less CPU per request (docs/performance.md note 19).
STREAM_HIGH_WATER = 1 / 16


def write_stream_settings(bpf, options: ProgramOptions) -> None:
    """bpf/call_out.c stream_settings: before any uprobe is attached (nothing streams
    until then). The host-wide rate is split evenly over the CPUs (a per-CPU bucket)."""
    table = bpf[b"stream_settings"]
    leaf = table.Leaf()
    leaf.rate_per_cpu = -(-options.stream_rate // (os.cpu_count() or 1))
    leaf.high_water = int(options.map_sizes()["events"] * STREAM_HIGH_WATER)
    leaf.budget = options.stream_budget
    table[table.Key(0)] = leaf


def _load(options: ProgramOptions, stats, compile_only: bool):
    kernel_headers_hint()
    from bcc import BPF  # imported late: the unit tier runs without bcc

    from . import bcc_abi
    bcc_abi.apply()  # uprobes without a garbage ref_ctr_offset (other tools can attach too)

    text, cflags, sizes = source_text().encode(), options.cflags(), options.map_sizes()
    if not options.bpf_cache:
        return _compile(BPF, text, cflags + options.size_cflags(), compile_only)
    from . import cached_bpf
    from .program_cache import Uncacheable
    cache, key = program_cache(options, text)
    if not compile_only:
        try:
            entry = cache.read(key)
            if entry is not None:
                bpf = cached_bpf.CachedBPF(entry.sized(sizes))
                log.info("BPF program from the cache %s (no compile)", cache.entry_path(key))
                return bpf
        except Exception as e:  # CacheError, or the kernel refused what the entry holds
            log.warning("BPF cache entry %s unusable: %s; compiling", cache.entry_path(key), e)
            if stats is not None:
                stats.add("bpf_cache_invalid")
    bpf = _compile(BPF, text, cflags, compile_only)  # maps at bpf/maps.h's sizes
    try:
        entry = cached_bpf.extract(bpf)
    except Uncacheable as e:
        log.warning("BPF program not cached (%s): every start compiles", e)
        if compile_only or all(bpf[name.encode()].max_entries == n for name, n in sizes.items()):
            return bpf
        bpf.cleanup()  # other sizes, and no entry to make its maps from: they are compiled in
        return _compile(BPF, text, cflags + options.size_cflags(), compile_only)
    try:
        log.info("BPF program cached in %s", cache.write(key, entry))
    except OSError as e:
        log.warning("BPF program not cached (%s): every start compiles", e)
    if compile_only or entry.has_sizes(sizes):
        return bpf
    bpf.cleanup()  # other sizes: its maps made again, from the entry
    return cached_bpf.CachedBPF(entry.sized(sizes))


def program_cache(options: ProgramOptions, text: Optional[bytes] = None):
    """(CacheDir, key) of this program: the entry a start with `options` reads."""
    from bcc import __version__ as bcc_version

    from .program_cache import CacheDir, cache_key
    kernel_headers_hint()  # which header tree bcc compiles against is part of the key
    text = source_text().encode() if text is None else text
    return CacheDir(options.bpf_cache), cache_key(text, options.cflags(), bpf_dir(), os.uname().release, bcc_version,
                                                  kernel_tree())


def _compile(BPF, text: bytes, cflags: list, compile_only: bool):
    log.debug("compiling %s with %s", PROGRAM_FILES, cflags)
    if not compile_only:
        return BPF(text=text, cflags=cflags)

    class _NoAutoload(BPF):  # maps created, nothing loaded or attached
        def _trace_autoload(self):
            pass
    return _NoAutoload(text=text, cflags=cflags)
