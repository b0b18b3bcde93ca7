"""For bpf-tier tests that load the program themselves (no collector): a child process
driven one JSON line at a time, and the loaded program with the records it streamed."""
from __future__ import annotations

import ctypes as ct
import json
import os
import select
import subprocess

from otel_gpu.config import DEFAULT_BPF_CACHE
from otel_gpu.kernel_io.decode import decode
from otel_gpu.records import LibraryLoaded
from otel_gpu.probes.rows import rows_for
from tests.harness import ROOT, TARGETS


def open_fds(kind: str, pid: int | str = "self") -> int:
    """A process's open descriptors of one anonymous-inode kind: "[perf_event]" (an
    attached tracepoint or perf uprobe), "bpf_link" (an uprobe_multi link, a raw
    tracepoint), "bpf-map", "bpf-prog"."""
    n = 0
    for fd in os.listdir(f"/proc/{pid}/fd"):
        try:
            n += os.readlink(f"/proc/{pid}/fd/{fd}") == f"anon_inode:{kind}"
        except OSError:
            pass
    return n


def build_stub(out_dir, source: str, name: str, *link: str) -> str:
    """A stub library from tests/bpf/targets/<source>, built as out_dir/<name>."""
    out = out_dir / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(TARGETS / source), *link], check=True)
    return str(out)


def build_driver_stubs(out_dir, runtime: str) -> tuple[str, str, str]:
    """The stand-in libcuda.so.1 (stub_libcuda.c), a stand-in libcudart named `runtime` that
    reaches its cuLaunchKernel as the real one does on a GPU (stub_cudart_driver.c), and a
    library launching through the driver itself, as cuBLAS does (stub_driver_library.c)."""
    drv = build_stub(out_dir, "stub_libcuda.c", "libcuda.so.1")
    link = [f"-L{out_dir}", "-l:libcuda.so.1", f"-Wl,-rpath,{out_dir}"]
    return (drv, build_stub(out_dir, "stub_cudart_driver.c", runtime, *link),
            build_stub(out_dir, "stub_driver_library.c", "libstub_blas.so", *link))


# The start of a child script that calls the real libcudart's cudaLaunchKernel (as `rt`).
LAUNCH_CHILD_HEAD = r'''
import ctypes as ct, json, socket, sys
from otel_gpu.demo.cuda_work import find_cudart
path = find_cudart()
rt = ct.CDLL(path)
vp, u = ct.c_void_p, ct.c_uint
class Dim3(ct.Structure):
    _fields_ = [("x", u), ("y", u), ("z", u)]
rt.cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, vp, ct.c_size_t, vp]
'''


class Child:
    """argv runs a script that prints one JSON line at start (`hello`) and one per
    command read from stdin."""

    def __init__(self, argv: list[str]) -> None:
        self.proc = subprocess.Popen(argv, cwd=ROOT, text=True, stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.pid = self.proc.pid
        self.hello = self.reply()

    def reply(self) -> dict:
        """The next JSON line it prints."""
        ready, _, _ = select.select([self.proc.stdout], [], [], 60)
        line = self.proc.stdout.readline() if ready else ""
        assert line, f"child {self.pid} gave no answer (exit {self.proc.poll()})"
        return json.loads(line)

    def send(self, command: str) -> None:
        self.proc.stdin.write(command + "\n")
        self.proc.stdin.flush()

    def run(self, command: str) -> dict:
        self.send(command)
        return self.reply()

    def stop(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


class Probes:
    """The loaded program, the records it streamed, and its maps."""

    def __init__(self) -> None:
        from otel_gpu.probes.pid_bits import PidBits
        from otel_gpu.probes.source import ProgramOptions, load
        from otel_gpu.kernel_io.reader import RollupReader
        from otel_gpu.kernel_io import launch_slots
        # From the collectors' own program cache: compiled once per host and source, as a
        # collector would be (tests/bpf/test_program_cache.py proves the two the same).
        options = ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE)
        self.bpf = load(options)
        self.pid_bits = PidBits(self.bpf["pid_bits"], options.pid_words)
        self.cpus = options.cpus
        self._rollups = RollupReader(self.bpf["rollup"],
                                     launch_slots.reader(self.bpf, options.cpus, self.pid_bits.traced.__contains__))
        self._rolled_up: dict = {}  # (tgid, call, detail) -> [count, bytes, duration_ns] so far
        self._set_by_pid: dict = {}
        self.records: list = []
        self.bpf["events"].open_ring_buffer(self._on_record)
        from otel_gpu.probes.uprobe_links import choose
        self.uprobes = choose(self.bpf)  # as the collector plants them: links on this kernel
        self.handles: list = []
        self._verdict_gen = 0

    def _on_record(self, _ctx, data, size) -> int:
        record = decode((ct.c_char * size).from_address(data))
        if record.__class__ is not LibraryLoaded:  # a cue for the reader (kernel_io/reader.py), not a record
            self.records.append(record)
        return 0

    def attach(self, library: str, path: str, pid: int) -> int:
        """Every row of `library` the file defines, for `pid` only; how many attached."""
        n = 0
        for row in rows_for(library):
            try:
                self.handles += self.uprobes.attach(path, row.entry, symbol=row.symbol, pid=pid)
            except Exception as e:
                assert "could not determine address" in str(e), e
                continue
            n += 1
            if row.ret:
                self.handles += self.uprobes.attach(path, row.ret, symbol=row.symbol, ret=True, pid=pid)
        return n

    def set(self, table: str, pid: int, value) -> None:
        self.bpf[table][ct.c_uint32(pid)] = value
        if table in ("traced", "http_active"):
            self._mark(pid, table, value.value)
        self._verdicts_changed()

    def unset(self, table: str, pid: int) -> None:
        try:
            del self.bpf[table][ct.c_uint32(pid)]
        except KeyError:
            pass
        if table in ("traced", "http_active"):
            self._mark(pid, table, 0)
        self._verdicts_changed()

    def _verdicts_changed(self) -> None:
        """As the collector does after its own writes (kernel_io/program.py); here for
        http_active too, which these tests write in place of the HTTP probes (whose
        changes bump the process's epoch)."""
        self._verdict_gen += 1
        self.bpf["verdict_gen"][ct.c_int(0)] = ct.c_uint32(self._verdict_gen)

    def _mark(self, pid: int, table: str, value: int) -> None:
        """pid_bits as the collector and kernel keep them (bpf/maps.h): `traced` sets
        TRACED (and SLOW when following); `http_active`, written here in place of the
        kernel's HTTP probes, sets SLOW as they do."""
        from otel_gpu.probes.pid_bits import SLOW, TRACED
        mine = self._set_by_pid.setdefault(pid, {})
        mine[table] = value
        following = mine.get("traced", TRACED) not in (0, TRACED)
        self.pid_bits.set(pid, (TRACED if mine.get("traced") else 0)
                          | (SLOW if following or mine.get("http_active", 0) > 0 else 0))

    def rollup(self, pid: int) -> dict:
        """(call, detail) -> [count, bytes, duration_ns]: what the kernel counted for pid
        (the rollup hash and the launch slots), read as the collector reads it."""
        for r in self._rollups.read(0):
            total = self._rolled_up.setdefault((r.tgid, r.call, r.detail), [0, 0, 0])
            for i, v in enumerate((r.count, r.bytes, r.duration_ns)):
                total[i] += v
        return {(call, detail): list(v) for (tgid, call, detail), v in self._rolled_up.items() if tgid == pid}

    def close(self) -> None:
        """Detaches every probe as the collector does (otel_gpu/probes/closer.py: closed
        from many threads, uprobe_events read once), then frees the programs and maps.
        bcc's cleanup alone closes them one at a time (0.1-1 s each): a module's probes of
        four children took 482 s at load average ~30."""
        from otel_gpu.probes.closer import ProbeCloser
        from otel_gpu.ratelimit import Stats
        stats = Stats()
        closer = ProbeCloser(self.bpf, stats)
        closer.detach_all([h for h in self.handles if isinstance(h, int)])
        assert closer.wait(300), f"{closer.pending()} probes still closing"
        self.bpf.cleanup()
        assert not stats.snapshot(), stats.snapshot()  # probe_detach_failed: logged, counted

    def of(self, pid: int) -> list:
        """The records of `pid` streamed so far."""
        self.bpf.ring_buffer_consume()
        return [r for r in self.records if r.tgid == pid]
