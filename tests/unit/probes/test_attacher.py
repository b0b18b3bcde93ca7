"""The Attacher's bookkeeping: per-process probes (--pid/--exe) kept apart per (file,
pid), detached per pid, failures counted, a process that leaves while being probed
leaves nothing. FakeBpf stands in for bcc's BPF object (no root in this tier; the
real attach and detach are tests/bpf/test_pid_scoped_probes.py)."""
from __future__ import annotations

from pathlib import Path

import pytest

from otel_gpu.probes.attacher import RETRY_MAX_S, RETRY_TRIES, Attacher
from otel_gpu.probes.discovery import ProbeTarget
from otel_gpu.probes.tls_entries import internal_entries
from otel_gpu.cuda_calls import RUNTIME, TLS
from otel_gpu.probes.rows import rows_for
from otel_gpu.ratelimit import Stats


class FakeBpf:
    """bcc's uprobe_fds bookkeeping: one event name per (path, symbol, kind, pid)."""

    def __init__(self, absent=(), broken=(), broken_ret=()):
        self.uprobe_fds: dict[bytes, int] = {}
        self.absent, self.broken, self.broken_ret = set(absent), set(broken), set(broken_ret)
        self.tries: list[str] = []  # symbols, in attach order, entry probes only

    def _attach(self, kind, name, sym, fn_name, pid):
        if kind == b"p":
            self.tries.append(sym.decode())
        if sym.decode() in self.absent:
            raise Exception(f"could not determine address of symbol {sym.decode()}")
        if sym.decode() in self.broken or (kind == b"r" and sym.decode() in self.broken_ret):
            raise Exception("Failed to attach BPF to uprobe")
        self.uprobe_fds[b"%s_%s_%s_%d" % (kind, name, sym, pid)] = 1

    def attach_uprobe(self, name, sym, fn_name, pid=-1, addr=None, sym_off=0):
        self._attach(b"p", name, sym or b"%x" % addr, fn_name, pid)

    def attach_uretprobe(self, name, sym, fn_name, pid=-1, addr=None):
        self._attach(b"r", name, sym or b"%x" % addr, fn_name, pid)

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


class Clock:
    def __init__(self):
        self.now = 100.0

    def __call__(self):
        return self.now


def test_a_failed_probe_is_retried_with_backoff_and_attaches_when_it_can(tmp_path):
    bpf, stats, clock = FakeBpf(broken={"cudaLaunchKernel"}), Stats(), Clock()
    a = Attacher(bpf, stats, SyncCloser(bpf), clock)
    t = _target(tmp_path)
    assert a.attach(t) == PROBES - 1
    assert a.failed == {"cudaLaunchKernel": 1} and "cudaLaunchKernel" not in a.by_symbol
    assert [(s, p) for s, p, _ in a.missing_launches()] == [("cudaLaunchKernel", t.path)]
    retries_at = []
    for step in (0.5, 0.9, 1.0, 2.9, 3.0, 6.9):  # due at +1, then +2 after that (+3), then +4 (+7)
        clock.now = 100.0 + step
        before = bpf.tries.count("cudaLaunchKernel")
        assert a.attach(t) == 0
        if bpf.tries.count("cudaLaunchKernel") > before:
            retries_at.append(step)
    assert retries_at == [1.0, 3.0]
    assert stats.snapshot() == {"probe_attach_failed": 3, "probe_attach_retried": 2}
    bpf.broken.clear()  # the conflicting registration went away
    clock.now = 107.0
    assert a.attach(t) == 1
    assert a.failed == {} and a.by_symbol["cudaLaunchKernel"] == 1 and a.missing_launches() == []
    assert a.probe_count == PROBES == len(bpf.uprobe_fds)
    clock.now = 1000.0
    assert a.attach(t) == 0 and stats.snapshot() == {"probe_attach_failed": 3, "probe_attach_retried": 3}
    assert a.counts().attached["cudaLaunchKernel"] == 1 and a.counts().failed == {}


def test_retries_stop_after_the_last_try_with_waits_doubling_to_the_cap(tmp_path):
    bpf, stats, clock = FakeBpf(broken={"cudaMemcpy"}), Stats(), Clock()
    a = Attacher(bpf, stats, SyncCloser(bpf), clock)
    t = _target(tmp_path)
    a.attach(t, 9)
    tried_at = []
    for tick in range(0, 2000):  # a scan every 0.5 s for ~17 minutes
        clock.now = 100.0 + tick * 0.5
        n = bpf.tries.count("cudaMemcpy")
        a.attach(t, 9)
        if bpf.tries.count("cudaMemcpy") > n:
            tried_at.append(clock.now - 100.0)
    waits = [b - a_ for a_, b in zip([0.0] + tried_at, tried_at)]
    assert len(tried_at) == RETRY_TRIES
    assert waits[:6] == [1, 2, 4, 8, 16, 32] and set(waits[6:]) == {RETRY_MAX_S}
    assert a.failed == {"cudaMemcpy": 1} and a.missing_launches() == []  # a copy, not a launch
    assert stats.snapshot() == {"probe_attach_failed": 1 + RETRY_TRIES, "probe_attach_retried": RETRY_TRIES}


def test_a_row_attaches_all_or_nothing_and_a_process_that_goes_takes_its_failures(tmp_path):
    """cudaMalloc's entry attaches but its return probe fails: the entry is taken off
    (a half row would count allocations it never sees return), and the retry attaches both."""
    bpf, stats, clock = FakeBpf(broken_ret={"cudaMalloc"}), Stats(), Clock()
    a = Attacher(bpf, stats, SyncCloser(bpf), clock)
    t = _target(tmp_path)
    assert a.attach(t, 5) == PROBES - 2 == len(bpf.uprobe_fds)
    assert not any(b"cudaMalloc" in ev for ev in bpf.uprobe_fds) and a.failed == {"cudaMalloc": 1}
    bpf.broken_ret.clear()
    clock.now += 1
    assert a.attach(t, 5) == 2 and a.failed == {} and a.probe_count == PROBES
    bpf.broken.add("cudaLaunchKernel")
    a.attach(t, 6)
    assert a.failed == {"cudaLaunchKernel": 1} and a.pids() == {5, 6}
    assert a.detach(6) == PROBES - 1
    assert a.failed == {} and a.missing_launches() == [] and a.by_symbol["cudaLaunchKernel"] == 1


class OrderedUprobes:
    """The uprobes backend's contract as the attacher uses it: prepare() with a file's
    functions before its first attach, then each probe in its row's order."""

    def __init__(self):
        self.calls: list = []

    def prepare(self, fn_names):
        self.calls.append(("prepare", list(fn_names)))

    def attach(self, path, fn_name, symbol="", addr=None, ret=False, pid=None):
        self.calls.append(("attach", fn_name))
        return [f"{fn_name}:{symbol}:{ret}"]


def test_a_files_functions_are_prepared_in_its_probes_order_before_they_attach(tmp_path):
    """prepare() starts verifying ahead what the probes will run, in their order, so the
    launch probe (the first row) waits on its own program only (CachedBPF.preload): with
    every program loaded before the first attach, a server's first requests lost their
    launches (tests/bpf/test_first_requests.py)."""
    uprobes = OrderedUprobes()
    a = Attacher(FakeBpf(), Stats(), SyncCloser(FakeBpf()), uprobes=uprobes)
    assert a.attach(_target(tmp_path)) == PROBES
    (kind, names), *attaches = uprobes.calls
    assert kind == "prepare" and all(k == "attach" for k, _ in attaches)
    assert names == [fn for row in ROWS for fn in (row.entry, row.ret) if fn]
    assert [fn for _, fn in attaches] == names  # the same order: the first ready, the first attached
    assert names[0] == "cuda_launch_kernel"


def test_a_probe_x86_single_steps_is_named_once_per_file(tmp_path, caplog):
    """Debian's libssl (read here, probed through FakeBpf): its reads and writes are probed
    at internal functions that start with a push (tls_entries.py); SSL_free starts with
    `test %rdi,%rdi`, which x86 single-steps: named in the log and in status, once."""
    lib = Path("/usr/lib/x86_64-linux-gnu/libssl.so.3")
    if not lib.exists():
        pytest.skip("no Debian libssl here")
    bpf = FakeBpf()
    a = Attacher(bpf, Stats(), SyncCloser(bpf))
    t = ProbeTarget(TLS, str(lib), (1, 3), internal_entries(str(lib)))
    with caplog.at_level("WARNING"):
        a.attach(t)
        a.attach(t, 9)  # the same file again, for one process: not named twice
    assert a.single_stepped == {"SSL_free": {str(lib)}, "SSL_do_handshake": set(), "ssl_read_internal": set(),
                                "ssl_write_internal": set()}
    assert [r.getMessage().split(":")[0] for r in caplog.records] == [f"SSL_free in {lib}"]
