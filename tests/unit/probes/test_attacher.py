"""The Attacher's bookkeeping: per-process probes (--pid/--exe) kept apart per (file,
pid), detached per pid, failures counted, a process that leaves while being probed
leaves nothing. FakeBpf stands in for bcc's BPF object (no root in this tier; the
real attach and detach are tests/bpf/test_pid_scoped_probes.py)."""
from __future__ import annotations

from otel_gpu.probes.attacher import Attacher
from otel_gpu.probes.discovery import ProbeTarget
from otel_gpu.probes.table import RUNTIME, rows_for
from otel_gpu.ratelimit import Stats


class FakeBpf:
    """bcc's uprobe_fds bookkeeping: one event name per (path, symbol, kind, pid)."""

    def __init__(self, absent=(), broken=()):
        self.uprobe_fds: dict[bytes, int] = {}
        self.absent, self.broken = set(absent), set(broken)

    def _attach(self, kind, name, sym, fn_name, pid):
        if sym.decode() in self.absent:
            raise Exception(f"could not determine address of symbol {sym.decode()}")
        if sym.decode() in self.broken:
            raise Exception("Failed to attach BPF to uprobe")
        self.uprobe_fds[b"%s_%s_%s_%d" % (kind, name, sym, pid)] = 1

    def attach_uprobe(self, name, sym, fn_name, pid=-1):
        self._attach(b"p", name, sym, fn_name, pid)

    def attach_uretprobe(self, name, sym, fn_name, pid=-1):
        self._attach(b"r", name, sym, fn_name, pid)

    def detach_uprobe_event(self, ev):
        del self.uprobe_fds[ev]


class SyncCloser:
    """ProbeCloser's contract without descriptors: the events leave bcc's table."""

    def __init__(self, bpf):
        self.bpf = bpf

    def detach(self, events):
        for ev in events:
            self.bpf.detach_uprobe_event(ev)
        return len(events)


def _target(tmp_path, name="libcudart.so.12"):
    f = tmp_path / name
    f.write_bytes(b"")
    return ProbeTarget(RUNTIME, str(f), (1, hash(name)))


ROWS = rows_for(RUNTIME)
PROBES = len(ROWS) + sum(1 for r in ROWS if r.ret)


def test_per_process_probes_are_kept_and_detached_per_pid(tmp_path):
    bpf, stats = FakeBpf(), Stats()
    a = Attacher(bpf, stats, SyncCloser(bpf))
    t = _target(tmp_path)
    assert a.attach(t, 101) == PROBES
    assert a.attach(t, 101) == 0  # once per (file, process)
    assert a.attach(t, 202) == PROBES
    assert all(ev.endswith((b"_101", b"_202")) for ev in bpf.uprobe_fds)
    assert a.pids() == {101, 202} and a.files() == 1 and a.probe_count == 2 * PROBES
    assert a.detach(101) == PROBES
    assert all(ev.endswith(b"_202") for ev in bpf.uprobe_fds) and len(bpf.uprobe_fds) == PROBES
    assert a.pids() == {202} and a.probe_count == PROBES
    assert a.by_symbol["cudaLaunchKernel"] == 1
    assert a.detach(101) == 0
    assert stats.snapshot() == {}


def test_default_mode_probes_the_file_for_every_process(tmp_path):
    bpf = FakeBpf()
    a = Attacher(bpf, Stats(), SyncCloser(bpf))
    assert a.attach(_target(tmp_path)) == PROBES
    assert all(ev.endswith(b"_-1") for ev in bpf.uprobe_fds)
    assert a.pids() == set()


def test_failures_are_counted_absent_symbols_are_not(tmp_path):
    bpf, stats = FakeBpf(absent={"cudaLaunchKernel_ptsz"}, broken={"cudaMemcpy"}), Stats()
    a = Attacher(bpf, stats, SyncCloser(bpf))
    n = a.attach(_target(tmp_path), 7)
    missing = sum(1 + bool(r.ret) for r in ROWS if r.symbol in ("cudaLaunchKernel_ptsz", "cudaMemcpy"))
    assert missing == 2 and n == len(bpf.uprobe_fds) == PROBES - missing
    assert stats.snapshot() == {"probe_attach_failed": 1}
    assert a.failed == {"cudaMemcpy": 1}


def test_a_process_that_leaves_while_probed_leaves_nothing(tmp_path):
    bpf, stats = FakeBpf(), Stats()
    a = Attacher(bpf, stats, SyncCloser(bpf))
    gone = ProbeTarget(RUNTIME, str(tmp_path / "proc/55/root/libcudart.so.12"), (1, 2))  # path no longer there
    assert a.attach(gone, 55) == 0
    assert bpf.uprobe_fds == {} and a.pids() == set() and stats.snapshot() == {}
