"""kernel_io/program.py sample_heads: a kernel whose verifier refuses the head programs
(bpf/head_sampling.c) leaves sampling to the collector, said once and counted, and the
kernel is never told to draw (head_settings stays off), so nothing waits on a scan.
Programs wanted while requests flow are verified beside the poll loop; so is the HTTP/2
frame walk (bpf/h2_walk.c) at the start."""
import collections
import logging
import sys
import threading
import time
import types

import pytest

from otel_gpu.kernel_io.program import HEAD_PROGRAMS, BpfProgram
from otel_gpu.ratelimit import Stats


class RefusingBpf:
    """The two tables and load_func of a bcc BPF object, whose loads the kernel refuses."""

    def __init__(self) -> None:
        self.written: list = []

    def __getitem__(self, name):
        if name == "head_settings":
            raise AssertionError("head_settings written although the programs did not load")
        return self

    def __setitem__(self, key, value) -> None:
        self.written.append(key)

    def load_func(self, name, kind):
        raise Exception(f"Failed to load BPF program {name!r}: Argument list too long")


def test_refused_head_programs_leave_sampling_to_the_collector(caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "bcc", types.SimpleNamespace(BPF=types.SimpleNamespace(TRACEPOINT=5)))
    program = object.__new__(BpfProgram)  # no kernel: only what sample_heads touches
    program.bpf, program.stats = RefusingBpf(), Stats()
    with caplog.at_level(logging.WARNING):
        program.sample_heads(123, parents=False)
    assert program.stats.snapshot().get("head_sampling_unavailable") == 1
    assert "decided by the collector alone" in caplog.text and program.bpf.written == []
    program.sample_heads(None, parents=False)  # a sampler the kernel has nothing to decide for
    assert program.stats.snapshot().get("head_sampling_unavailable") == 1


class Table(dict):
    """A bcc table's item assignment (ctypes keys and values by their value), and
    head_settings' Key and Leaf."""

    Key = staticmethod(lambda i: i)
    Leaf = staticmethod(lambda: types.SimpleNamespace(bound=0, on=0, parents=0))

    def __setitem__(self, key, value) -> None:
        super().__setitem__(getattr(key, "value", key), getattr(value, "value", value))


def held_verifier(fds: dict):
    """A cached program (CachedBPF, none of bcc's state: only what preload, load_func and
    the tables touch) whose loads wait until the test sets `.verified`; each function
    gets its fd from `fds`; its maps are Tables."""
    from otel_gpu.probes import cached_bpf

    class HeldVerifier(cached_bpf.CachedBPF):
        def __init__(self) -> None:
            self.funcs, self._loading, self.verified = {}, {}, threading.Event()
            self.tables = collections.defaultdict(Table)  # the program's maps, by name

        def __getitem__(self, name):
            return self.tables[name]

        def _load(self, name, prog_type, device=None, attach_type=-1):
            assert self.verified.wait(10)
            fn = self.funcs[name] = types.SimpleNamespace(fd=fds[name])
            return fn

    return HeldVerifier()


def test_head_programs_wanted_mid_traffic_are_verified_beside_the_poll_loop(monkeypatch):
    """sample_heads(wait=False), as the first unsampled parent asks for them: the poll
    loop goes on handing records over while the verifier runs (~1 s) on a thread, and the
    poll after it has finished installs them: both programs in head_scans, then the
    settings that turn them on."""
    pytest.importorskip("bcc")
    from otel_gpu.probes import cached_bpf

    monkeypatch.setattr(cached_bpf.os, "cpu_count", lambda: 2)  # preload loads ahead from 2 CPUs
    program = object.__new__(BpfProgram)  # no kernel: only what sample_heads and poll touch
    program.bpf, program.stats, program._heads_verifying = held_verifier({b"head_scan": 100, b"head_parent": 101}), \
        Stats(), None
    program.ring = types.SimpleNamespace(poll=lambda timeout_ms: (["record"], -1), half_full=lambda now: False)
    program.aggregates = types.SimpleNamespace(merge=lambda batch: batch)
    program.collector = types.SimpleNamespace(busy=lambda: None, idle=lambda: None)
    program.sample_heads(7, parents=True, wait=False)
    assert program.poll(0) == ["record"] and program.poll(0) == ["record"]  # the loop goes on
    assert program.bpf.tables["head_settings"] == {} and program.bpf.tables["head_scans"] == {}
    program.bpf.verified.set()
    deadline = time.monotonic() + 10
    while program.bpf.loading(HEAD_PROGRAMS) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert program.poll(0) == ["record"]
    assert program.bpf.tables["head_scans"] == {0: 100, 1: 101}
    settings = program.bpf.tables["head_settings"][0]
    assert (settings.bound, settings.on, settings.parents) == (7, 1, 1)
    assert program._heads_verifying is None and not program.stats.snapshot().get("head_sampling_unavailable")


def test_h2_walk_is_verified_beside_the_poll_loop_then_switched_on(monkeypatch):
    """bpf/h2_walk.c at the program's load: verified on a thread, one CPU or not, while the
    poll loop hands records over (in the loop it held a new library's probes ~0.5 s); the
    poll after it has finished puts it in h2_walkers, then switches the walk on."""
    pytest.importorskip("bcc")
    from otel_gpu.kernel_io.program import H2_PROGRAMS
    from otel_gpu.probes import cached_bpf

    monkeypatch.setattr(cached_bpf.os, "cpu_count", lambda: 1)  # one CPU: still on a thread
    program = object.__new__(BpfProgram)  # no kernel: only what the h2 walk's start and poll touch
    program.bpf, program.stats, program._heads_verifying = held_verifier({b"h2_walk": 200}), Stats(), None
    program.ring = types.SimpleNamespace(poll=lambda timeout_ms: (["record"], -1), half_full=lambda now: False)
    program.aggregates = types.SimpleNamespace(merge=lambda batch: batch)
    program.collector = types.SimpleNamespace(busy=lambda: None, idle=lambda: None)
    program._h2_walk_verifying = program._start_h2_walk()
    assert program._h2_walk_verifying and program.poll(0) == ["record"]  # the loop goes on
    assert program.bpf.tables["h2_walkers"] == {} and program.bpf.tables["h2_walk_on"] == {}
    program.bpf.verified.set()
    deadline = time.monotonic() + 10
    while program.bpf.loading(H2_PROGRAMS) and time.monotonic() < deadline:
        time.sleep(0.01)
    assert program.poll(0) == ["record"]
    assert program.bpf.tables["h2_walkers"] == {0: 200} and program.bpf.tables["h2_walk_on"] == {0: 1}
    assert not program._h2_walk_verifying and not program.stats.snapshot().get("h2_walk_unavailable")
