"""Finds GPU processes and the files to probe, through /proc: libcudart under any
name and path (wheels, toolkit, libcudart-<hash>.so.11.0), libcuda, NCCL, ROCm's
libamdhip64 and RCCL, and executables with cudart linked in statically (nvcc's
default); and, for a GPU
process that runs CPython, its interpreter file (probes/python.py says which), and for
one that is a Go executable, its goroutine layout and runtime functions
(probes/go_runtime.py, probes/go_functions.py).
Re-run every few seconds, so processes that start or dlopen CUDA later are picked up;
a process that loads or opens a CUDA library is scanned alone at once
(bpf/library_probes.c), so one found using none has its maps read again only every
QUIET_RESCAN_S, or at once when its executable changes (an exec); the well-known
library files are probed before any process maps them (known_library_files).

With a ProcessGroups (pipeline/groups.py): the processes related to a CUDA process
(same cgroup, or parent/child) that listen on TCP are found too, as servers to trace
(a front-end whose GPU work its worker does), and which CUDA processes listen."""
from __future__ import annotations

import glob
import logging
import os
import re
import time
from dataclasses import dataclass, field, replace
from typing import Callable, Iterable, Optional

from .. import proc
from .. import sockets
from ..cuda_calls import DEVICE_CLOCK, DRIVER, GO, HIP, NCCL, PYTHON, RUNTIME, TLS
from .rows import GO_PROBES
from . import go_functions, go_runtime, python, tls_entries
from .elf_file import ElfFile
from .runtime_text import runtime_ranges

log = logging.getLogger(__name__)

CUDART_RE = re.compile(r"/libcudart(?:[-.][^/]*)?\.so(?:\.[^/]*)?$")
DRIVER_RE = re.compile(r"/libcuda\.so(?:\.[^/]*)?$")
NCCL_RE = re.compile(r"/lib[nr]ccl\.so(?:\.[^/]*)?$")  # NCCL, and RCCL (its API): bpf/nccl_probes.c
HIP_RE = re.compile(r"/libamdhip64\.so(?:\.[^/]*)?$")  # ROCm's HIP runtime: bpf/hip_probes.c
LIBSSL_RE = re.compile(r"/libssl\.so\.(?:3|1\.1)$")  # OpenSSL 3 and 1.1 (bpf/tls_probes.c)
DEVICE_CLOCK_RE = re.compile(r"/libotel_gpu_cupti\.so$")  # device-clock mode's library (bpf/device_records.c)
# A part of every path the GPU patterns match: maps text holding none of them maps no GPU
# library, told without going through its lines (most processes on a node).
CUDA_MARKS = ("/libcudart", "/libcuda.so", "/libnccl.so", "/librccl.so", "/libamdhip64.so")
# A process found using no CUDA has its maps read again this often (its exe unchanged):
# a CUDA library it loads later is seen at its open (bpf/library_probes.c), so a full
# scan need not read every process's maps each time (~0.45 ms each for a Python process).
QUIET_RESCAN_S = 30.0
# A process found listening is asked again this often: servers keep their listener, and
# each ask reads its TCP tables and descriptors (most of an idle node's scan, bench item 19).
LISTENING_RECHECK_S = 30.0


@dataclass(frozen=True)
class ProbeTarget:
    """A file to attach uprobes to: for every process mapping it, or (with
    --pid/--exe) for one process, through that process's root."""
    kind: str          # RUNTIME, DRIVER, NCCL, HIP, PYTHON, TLS, GO or DEVICE_CLOCK
    path: str          # openable from here (through /proc/<pid>/root for containers)
    key: tuple         # (st_dev, st_ino): the same file seen from several processes
    addresses: tuple = ()  # (symbol, address) its symbol table does not say (Go; libssl: tls_entries.py)


@dataclass
class ScanResult:
    cuda_pids: set
    targets: list      # each file once (the first process's path to it)
    # pid -> its files, each through its own /proc/<pid>/root: per-process probes
    by_pid: dict = field(default_factory=dict)
    # CUDA processes running a recognised CPython: pid -> python.PythonProcess
    python: dict = field(default_factory=dict)
    # CUDA processes that are Go executables whose goroutines can be read: pid -> GoBinary
    go: dict = field(default_factory=dict)
    # Processes that use no CUDA, listen on TCP and are related to a CUDA process
    # (groups): their requests may be what a related process's GPU work is for.
    servers: set = field(default_factory=set)
    # CUDA processes that listen on TCP themselves.
    listening: set = field(default_factory=set)
    # CUDA process -> its runtime's code ranges (probes/runtime_text.py); [] when it has none
    runtime_text: dict = field(default_factory=dict)


def libraries_in_maps(maps_text: str) -> list[tuple[str, str]]:
    """(kind, path) of the CUDA libraries mapped (and the device-clock library, which only a
    CUDA process loads), from /proc/<pid>/maps text."""
    if not any(mark in maps_text for mark in CUDA_MARKS):
        return []
    found = {}
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or not parts[5].startswith("/"):
            continue
        path = parts[5].removesuffix(" (deleted)")
        if CUDART_RE.search(path):
            found[path] = RUNTIME
        elif DRIVER_RE.search(path):
            found[path] = DRIVER
        elif NCCL_RE.search(path):
            found[path] = NCCL
        elif HIP_RE.search(path):
            found[path] = HIP
        elif DEVICE_CLOCK_RE.search(path):
            found[path] = DEVICE_CLOCK
    return [(kind, path) for path, kind in found.items()]


def libssl_in_maps(maps_text: str) -> list[str]:
    """Paths of the OpenSSL libssl files mapped, from /proc/<pid>/maps text."""
    found = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        path = parts[5].removesuffix(" (deleted)") if len(parts) == 6 else ""
        if path.startswith("/") and LIBSSL_RE.search(path) and path not in found:
            found.append(path)
    return found


class Discovery:
    def __init__(self, proc_root: str = "/proc", pid_filter: Optional[Callable[[int], bool]] = None,
                 has_static_cudart: Optional[Callable[[str], bool]] = None, groups=None,
                 listens: Optional[Callable[[int], bool]] = None, clock: Callable[[], float] = time.monotonic,
                 execed: Optional[Callable[[], Optional[set]]] = None) -> None:
        self.proc_root = proc_root
        self.groups = groups  # pipeline.groups.ProcessGroups, or None: CUDA processes only
        self._listens_now = listens or (lambda pid: sockets.listens(proc_root, pid))
        self._listening: dict[int, float] = {}  # pid -> when to ask again, once found listening
        self.pid_filter = pid_filter
        self._has_static = has_static_cudart or _elf_defines_cuda_launch
        self._static_cache: dict[tuple, bool] = {}
        self._python_cache: dict[tuple, Optional[python.Interpreter]] = {}  # file (dev, ino) -> facts
        self._go_cache: dict[tuple, Optional[tuple]] = {}  # exe (dev, ino) -> (GoBinary, addresses)
        self._tls_cache: dict[tuple, tuple] = {}  # libssl (dev, ino) -> tls_entries.internal_entries
        self._known: dict[int, int] = {}  # pid -> start time, once found to use CUDA
        self._quiet: dict[int, tuple] = {}  # pid -> (exe key, when to read its maps again): no CUDA
        self._clock = clock
        # The processes that called exec since the last full scan (bpf/library_probes.c), or
        # None: then each quiet process's executable is stat()ed at every scan to tell one.
        self._execed = execed or (lambda: None)
        self.self_pid = os.getpid()

    def scan(self, only: Optional[set] = None) -> ScanResult:
        """Every process, or only the processes `only` (just seen loading a CUDA
        library: bpf/library_probes.c), then without the related-server search."""
        result = ScanResult(set(), [])
        seen_keys = set()
        pids = list(self._pids()) if only is None else sorted(only)
        others = []  # processes that pass the filters and use no CUDA
        now = self._clock()
        if only is None:  # processes gone since the last full scan
            live = set(pids)
            self._quiet = {pid: q for pid, q in self._quiet.items() if pid in live}
            self._listening = {pid: t for pid, t in self._listening.items() if pid in live}
        execed = self._execed() if only is None else None
        for pid in pids:
            if pid == self.self_pid or (self.pid_filter and not self.pid_filter(pid)):
                continue
            quiet, key = self._quiet.get(pid), None
            if only is None and quiet is not None and now < quiet[1]:
                # No CUDA when last read. Still so unless it called exec since: as the kernel
                # saw (nothing read), or, without that list, as its executable's file says.
                if execed is not None and pid not in execed:
                    others.append(pid)
                    continue
                if execed is None and quiet[0] == (key := self._exe_key(pid)):
                    others.append(pid)
                    continue
            key = key or self._exe_key(pid)
            exe = self._exe(pid, key)
            maps = proc.maps(self.proc_root, pid)
            if maps is None:
                self._quiet.pop(pid, None)
                continue  # gone, or a kernel thread
            targets = self._targets_of(pid, maps, exe)
            if not targets:
                others.append(pid)
                self._quiet[pid] = (key, now + QUIET_RESCAN_S)
                continue
            self._quiet.pop(pid, None)
            result.cuda_pids.add(pid)
            result.runtime_text[pid] = self._runtime_text(maps, exe, targets)
            py = self._python(pid, maps, exe)
            if py:
                targets.append(py[0])
                result.python[pid] = py[1]
            go = self._go(exe)
            if go:
                targets.append(go[0])
                result.go[pid] = go[1]
            targets += [self._tls(t) for t in (self._target(pid, TLS, lib) for lib in libssl_in_maps(maps)) if t]
            result.by_pid[pid] = targets
            for t in targets:
                if t.key not in seen_keys:
                    seen_keys.add(t.key)
                    result.targets.append(t)
        if self.groups is not None and only is None:
            self.groups.retain(pids)
            if result.cuda_pids:
                result.servers = {p for p in self.groups.relatives(others, result.cuda_pids) if self._listens(p, now)}
                result.listening = {p for p in result.cuda_pids if self._listens(p, now)}
        return result

    def _listens(self, pid: int, now: float) -> bool:
        """Whether the process holds a listening TCP socket: asked at every scan until it
        does, then every LISTENING_RECHECK_S (a listener that closed, or a pid reused by a
        process that does not listen, is seen at the recheck)."""
        if now < self._listening.get(pid, 0.0):
            return True
        if self._listens_now(pid):
            self._listening[pid] = now + LISTENING_RECHECK_S
            return True
        self._listening.pop(pid, None)
        return False

    def _pids(self) -> Iterable[int]:
        return proc.pids(self.proc_root)

    def _targets_of(self, pid: int, maps: str, exe: Optional[tuple]) -> list[ProbeTarget]:
        out = []
        for kind, path in libraries_in_maps(maps):
            t = self._target(pid, kind, path)
            if t:
                out.append(t)
        static = self._static_exe(exe)
        if static:
            out.append(static)
        return out

    @staticmethod
    def _runtime_text(maps: str, exe: Optional[tuple], targets: list) -> list[tuple[int, int]]:
        paths = {path for kind, path in libraries_in_maps(maps) if kind == RUNTIME}
        if exe is not None and any(t.kind == RUNTIME and t.key == exe[2] for t in targets):
            paths.add(exe[0].removesuffix(proc.DELETED))  # cudart linked into the executable
        return runtime_ranges(maps, paths)

    def _python(self, pid: int, maps: str, exe: Optional[tuple]) -> Optional[tuple[ProbeTarget, python.PythonProcess]]:
        """The interpreter file to probe and where the process keeps its threads' states,
        or None (not Python, or a CPython whose layout is not known)."""
        lib = python.libpython_in_maps(maps)
        if lib:
            target = self._target(pid, PYTHON, lib)
            if target is None:
                return None
            if target.key not in self._python_cache:
                self._python_cache[target.key] = python.interpreter(target.path, python.version_of_name(lib))
            found = python.process(self._python_cache[target.key], maps, lib)
            return (target, found) if found else None
        if exe is None:
            return None
        link, path, key = exe
        if key not in self._python_cache:
            self._python_cache[key] = python.interpreter(path, python.exe_version(link, path))
        found = python.process(self._python_cache[key], maps, link.removesuffix(proc.DELETED))
        return None if found is None else (ProbeTarget(PYTHON, path, key), found)

    def _go(self, exe: Optional[tuple]) -> Optional[tuple[ProbeTarget, go_runtime.GoBinary]]:
        """The Go executable to probe and where its goroutines are, or None (not Go, or
        a Go whose layout or TLS slot is not known: its goroutines are not read)."""
        if exe is None:
            return None
        _, path, key = exe
        if key not in self._go_cache:
            self._go_cache[key] = _go_facts(path)
        facts = self._go_cache[key]
        if facts is None:
            return None
        binary, addresses = facts
        return ProbeTarget(GO, path, key, addresses), binary

    def _tls(self, t: ProbeTarget) -> ProbeTarget:
        """A libssl with the addresses of its internal read and write functions, where its
        code proves them (probes/tls_entries.py), read once per file."""
        if t.key not in self._tls_cache:
            self._tls_cache[t.key] = tls_entries.internal_entries(t.path)
        return replace(t, addresses=self._tls_cache[t.key])

    def _target(self, pid: int, kind: str, path: str) -> Optional[ProbeTarget]:
        # Through the process's root, so a container's files are reached from the host.
        for candidate in (proc.path(self.proc_root, pid, "root") + path, path):
            try:
                st = os.stat(candidate)
                return ProbeTarget(kind, candidate, (st.st_dev, st.st_ino))
            except OSError:
                continue
        return None

    def _exe_key(self, pid: int) -> Optional[tuple]:
        """(st_dev, st_ino) of the running file, even if replaced: all a quiet process's
        scan reads (one stat), to tell an exec."""
        try:
            st = os.stat(proc.path(self.proc_root, pid, "exe"))
        except OSError:
            return None
        return st.st_dev, st.st_ino

    def _exe(self, pid: int, key: Optional[tuple]) -> Optional[tuple[str, str, tuple]]:
        """(exe link, the file's path from here, key) for the key _exe_key read."""
        link = proc.exe(self.proc_root, pid) if key is not None else None
        if link is None:
            return None
        return link, proc.path(self.proc_root, pid, "root") + link, key

    def _static_exe(self, exe: Optional[tuple]) -> Optional[ProbeTarget]:
        if exe is None:
            return None
        _, path, key = exe
        if key not in self._static_cache:
            self._static_cache[key] = os.path.exists(path) and self._has_static(path)
        return ProbeTarget(RUNTIME, path, key) if self._static_cache[key] else None


# Where CUDA libraries live before any process maps them: the toolkit, the driver,
# and the nvidia-cuda-runtime (and torch) wheels in the usual Python environments.
WELL_KNOWN_LIBRARIES = (
    "/usr/local/cuda*/lib64/libcudart.so*", "/usr/local/cuda*/targets/*/lib/libcudart.so*",
    "/usr/lib/x86_64-linux-gnu/libcudart.so*", "/usr/lib64/libcudart.so*",
    "/usr/lib/x86_64-linux-gnu/libcuda.so*", "/usr/lib64/libcuda.so*", "/usr/lib/wsl/lib/libcuda.so*",
    "/usr/lib/x86_64-linux-gnu/libnccl.so*", "/usr/lib64/libnccl.so*",
    # ROCm: Debian's and AMD's packages (/opt/rocm is a link to /opt/rocm-<version>).
    "/usr/lib/x86_64-linux-gnu/libamdhip64.so*", "/opt/rocm*/lib/libamdhip64.so*",
    "/usr/lib/x86_64-linux-gnu/librccl.so*", "/opt/rocm*/lib/librccl.so*",
    # The system OpenSSL (Python's ssl module links it): HTTPS from a process's first request.
    "/usr/lib/x86_64-linux-gnu/libssl.so.3", "/usr/lib/x86_64-linux-gnu/libssl.so.1.1", "/usr/lib64/libssl.so.3",
)
SITE_DIRS = ("/usr/lib/python3*/dist-packages", "/usr/local/lib/python3*/*-packages",
             "/opt/conda/lib/python3*/site-packages", "/opt/conda/envs/*/lib/python3*/site-packages")
IN_SITE = ("nvidia/cuda_runtime/lib/libcudart.so*", "torch/lib/libcudart*.so*", "nvidia/nccl/lib/libnccl.so*",
           "torch/lib/libamdhip64.so*", "torch/lib/librccl.so*")  # PyTorch's ROCm wheels carry both


def known_library_files(host_root: str = "", site_dirs: Iterable[str] = ()) -> list[ProbeTarget]:
    """The CUDA runtime and driver files at the well-known places, each file once:
    probed before any process maps them, a process's first call is seen with no
    /proc scan. `host_root` prefixes the host's paths (a container's view of the
    host); `site_dirs`: more Python site-packages directories (the collector's own)."""
    patterns = [host_root + p for p in WELL_KNOWN_LIBRARIES]
    sites = [host_root + d for d in SITE_DIRS] + [glob.escape(d) for d in site_dirs]
    patterns += [f"{d}/{p}" for d in sites for p in IN_SITE]
    out, keys = [], set()
    for path in sorted({hit for p in patterns for hit in glob.glob(p)}):
        kind = RUNTIME if CUDART_RE.search(path) else DRIVER if DRIVER_RE.search(path) else \
            TLS if LIBSSL_RE.search(path) else NCCL if NCCL_RE.search(path) else HIP if HIP_RE.search(path) else None
        try:
            st = os.stat(path)
        except OSError:
            continue
        if kind and (st.st_dev, st.st_ino) not in keys:
            keys.add((st.st_dev, st.st_ino))
            t = ProbeTarget(kind, path, (st.st_dev, st.st_ino))
            out.append(replace(t, addresses=tls_entries.internal_entries(path)) if kind == TLS else t)
    return out


def _go_facts(path: str) -> Optional[tuple]:
    """(GoBinary, (symbol, address) of the runtime functions probed), or None."""
    binary = go_runtime.inspect(path)
    if binary is None or binary.layout is None or binary.tls_g is None:
        if binary is not None:
            log.info("%s: %s, goroutines not read (%s)", path, binary.version,
                     "a Go release not known" if binary.layout is None else "g's TLS slot not known")
        return None
    try:
        with open(path, "rb") as f:
            found = go_functions.addresses(ElfFile(f), [r.symbol for r in GO_PROBES])
    except (OSError, ValueError):
        found = {}
    return binary, tuple(sorted(found.items()))


def _elf_defines_cuda_launch(path: str) -> bool:
    """True when the executable itself defines cudaLaunchKernel (static cudart)."""
    from bcc import BPF
    try:
        return bool(BPF.get_user_functions_and_addresses(path, r"^cudaLaunchKernel$"))
    except Exception:  # not an ELF, unreadable: not a target
        return False
