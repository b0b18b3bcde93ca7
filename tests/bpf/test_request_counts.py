"""A thread's standing verdict (bpf/request_counts.c), on the real libcudart: once its
streaming budget is spent, or while its process is quiet, a thread's launches are
counted in req_agg without deciding again, until what the verdict was made from
changes: the process's HTTP reads and epoch (http_seq, as its word in http_seq_words
says), or user space's verdict_gen.
The loaded program (conftest's `probes`) and the maps are the collector's; http_active
and http_seq are written here in place of the HTTP probes, as a request's read would
leave them."""
from __future__ import annotations

import ctypes as ct
import sys
from types import SimpleNamespace

import pytest

from otel_gpu.cuda_calls import RUNTIME
from otel_gpu.kernel_io.abi import HttpSeq
from otel_gpu.probes.source import ProgramOptions
from otel_gpu.records import LaunchCall
from tests.bpf.probe_harness import LAUNCH_CHILD_HEAD, Child

BUDGET = ProgramOptions().stream_budget
CHILD = LAUNCH_CHILD_HEAD + r'''
f = ct.cast(ct.CDLL(None).getpid, vp).value  # stands for a kernel: nothing runs without a driver
print(json.dumps({"cudart": path, "func": f}), flush=True)
for line in sys.stdin:
    for _ in range(int(line)):
        rt.cudaLaunchKernel(f, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, 0)
    print("{}", flush=True)
'''


@pytest.fixture
def child(probes):
    c = Child([sys.executable, "-c", CHILD])
    probes.attach(RUNTIME, c.hello["cudart"], c.pid)
    probes.set("traced", c.pid, ct.c_uint32(1))
    probes.set("http_active", c.pid, ct.c_int64(1))  # inside a request
    yield c
    c.stop()


def _read(probes, pid: int, epoch: int, reads: int, bump: bool = True) -> None:
    """What an HTTP read of the process leaves in http_seq (bpf/maps.h epoch_submit): its
    word in http_seq_words bumped first, then the epoch and reads."""
    if bump:
        words, i = probes.bpf["http_seq_words"], ct.c_int(pid & (len(probes.bpf["http_seq_words"]) - 1))
        words[i] = ct.c_uint32(words[i].value + 1)
    probes.bpf["http_seq"][ct.c_uint32(pid)] = HttpSeq(epoch=epoch, reads=reads)


def _launches(probes, c: Child, n: int) -> tuple[int, int]:
    """n launches by the child: (streamed one by one, counted in req_agg) of them."""
    def counted():
        return sum(v.count for k, v in probes.bpf["req_agg"].items() if k.tgid == c.pid)
    streamed, before = len([r for r in probes.of(c.pid) if isinstance(r, LaunchCall)]), counted()
    c.run(str(n))
    return len([r for r in probes.of(c.pid) if isinstance(r, LaunchCall)]) - streamed, counted() - before


def _slot(probes, pid: int):
    """(index, slot) of the process's one thread with a verdict, or None."""
    found = [(i, s) for i, s in probes.bpf["verdict_slots"].items() if s.id >> 32 == pid]
    assert len(found) <= 1, found
    return found[0] if found else None


def _has_verdict(probes, pid: int) -> bool:
    return _slot(probes, pid) is not None


M64 = (1 << 64) - 1
FIB_MIX = 0x9E3779B97F4A7C15  # bpf/maps.h


def _check(slot) -> int:
    """bpf/request_counts.c verdict_check(): the slot's fields mixed."""
    t, b = slot.t, slot.t.basis
    h = slot.id
    for v in (b.word << 32 | b.gen, b.epoch << 32 | b.reads, b.unseen << 32 | t.ctx_offset,
              t.unit, t.tstate, t.self, t.id_offset):
        h = ((h ^ v) * FIB_MIX) & M64
    return h


def test_a_spent_budget_counts_until_the_next_read(probes, child):
    _read(probes, child.pid, epoch=1, reads=1)
    assert _launches(probes, child, BUDGET + 30) == (BUDGET, 30)
    assert _has_verdict(probes, child.pid)
    assert _launches(probes, child, 50) == (0, 50)  # under the verdict
    _read(probes, child.pid, epoch=2, reads=2)  # the next request: a budget of its own
    assert _launches(probes, child, BUDGET + 5) == (BUDGET, 5)
    _read(probes, child.pid, epoch=3, reads=2)  # a write: the budget stays spent
    assert _launches(probes, child, 7) == (0, 7)


def test_a_quiet_process_streams_again_once_user_space_wakes_it(probes, child):
    """quiet_procs set (no sampled request open): counted, and the verdict stands with no
    HTTP record; user space clearing it bumps verdict_gen, and the next launch streams."""
    _read(probes, child.pid, epoch=1, reads=1)
    probes.set("quiet_procs", child.pid, ct.c_uint8(1))
    assert _launches(probes, child, 20) == (0, 20)
    assert _has_verdict(probes, child.pid)
    probes.unset("quiet_procs", child.pid)
    assert _launches(probes, child, 20) == (20, 0)


def test_a_verdict_holds_while_the_processs_word_is_unchanged(probes, child):
    """A call reads the process's word, not http_seq: a change of http_seq that did not
    bump the word (which the probes never make) leaves the verdict standing, and counts go
    under the epoch the verdict copied; the word's bump ends it."""
    _read(probes, child.pid, epoch=1, reads=1)
    assert _launches(probes, child, BUDGET + 10) == (BUDGET, 10)
    _read(probes, child.pid, epoch=2, reads=2, bump=False)
    assert _launches(probes, child, 10) == (0, 10)
    assert {k.epoch for k, v in probes.bpf["req_agg"].items() if k.tgid == child.pid} == {1}
    _read(probes, child.pid, epoch=2, reads=2)
    assert _launches(probes, child, BUDGET + 10) == (BUDGET, 10)


def test_a_slot_whose_check_fails_is_no_verdict(probes, child):
    """A slot read while another CPU writes it (fields of two verdicts) must not stand:
    a field changed without its check is a miss, and the call decides again from
    http_seq; the same change with its check recomputed stands (so the check decides)."""
    _read(probes, child.pid, epoch=1, reads=1)
    assert _launches(probes, child, BUDGET + 10) == (BUDGET, 10)
    slots = probes.bpf["verdict_slots"]
    i, slot = _slot(probes, child.pid)
    assert slot.check == _check(slot)
    slot.t.basis.epoch = 7  # torn: the check is the old verdict's
    slots[i] = slot
    assert _launches(probes, child, 10) == (0, 10)
    assert {k.epoch for k, v in probes.bpf["req_agg"].items() if k.tgid == child.pid} == {1}
    i, slot = _slot(probes, child.pid)
    assert slot.t.basis.epoch == 1 and slot.check == _check(slot)  # decided again, whole
    slot.t.basis.epoch = 7
    slot.check = _check(slot)
    slots[i] = slot
    assert _launches(probes, child, 10) == (0, 10)
    assert {k.epoch for k, v in probes.bpf["req_agg"].items() if k.tgid == child.pid} == {1, 7}


def test_an_unchanged_generation_keeps_the_verdict(probes, child):
    """The other way round: without the bump a cleared quiet_procs is not seen (which is
    why user space bumps it after every change: kernel_io/program.py)."""
    _read(probes, child.pid, epoch=1, reads=1)
    probes.set("quiet_procs", child.pid, ct.c_uint8(1))
    assert _launches(probes, child, 10) == (0, 10)
    del probes.bpf["quiet_procs"][ct.c_uint32(child.pid)]  # no bump
    assert _launches(probes, child, 10) == (0, 10)
    _read(probes, child.pid, epoch=2, reads=2)
    assert _launches(probes, child, 10) == (10, 0)


def test_the_collector_bumps_the_generation_after_each_change():
    """kernel_io/program.py's writes to the tables a verdict is decided from: each one
    that can undo a verdict bumps verdict_gen to a value it never had (making a process
    quiet undoes none: its threads then count, as a standing verdict does)."""
    from otel_gpu.config import DEFAULT_BPF_CACHE
    from otel_gpu.kernel_io.program import BpfProgram
    from otel_gpu.ratelimit import Stats
    program = BpfProgram(ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE), Stats())
    gen = lambda: program.bpf["verdict_gen"][ct.c_int(0)].value  # noqa: E731
    pid = 4_000_000 - 7  # no such process: only the maps are written
    # What probes/python.py and probes/go_runtime.py find in a process: its layout's offsets.
    python = SimpleNamespace(main_interp=0x7F00_0000, layout=SimpleNamespace(threads_head=8, thread_id=16, context=24))
    go = SimpleNamespace(tls_g=-8, layout=SimpleNamespace(g_m=48, m_curg=192, g_goid=152, g_parent_goid=272))
    try:
        seen = [gen()]
        for what, change, bumps in [("trace", lambda: program.trace(pid), True),
                                    ("python", lambda: program.trace_python(pid, python, {0x7F10: 0x7F20}), True),
                                    ("go", lambda: program.trace_go(pid, go), True),
                                    ("follow", lambda: program.follow(pid, 1234), True),
                                    ("unfollow", lambda: program.follow(pid, None), True),
                                    ("quiet", lambda: program.set_quiet({pid: True}), False),
                                    ("woken", lambda: program.set_quiet({pid: False}), True),
                                    ("exited", lambda: program.forget({pid}), True)]:
            change()
            now = gen()
            assert (now not in seen) if bumps else (now == seen[-1]), (what, seen, now)
            seen.append(now)
    finally:
        program.close()


def test_the_per_request_counts_are_read_as_the_kernels_bytes(probes):
    """The reader takes req_agg at every poll as the kernel lays it out (kernel_io/map_batch.py
    packed()) and reads its rows with `struct` (kernel_io/kept_counts.py KEY, VALUE): the
    map's key and value must be those layouts' sizes."""
    from otel_gpu.kernel_io.abi import AggKey, AggValue
    from otel_gpu.kernel_io.kept_counts import KEY, VALUE
    from otel_gpu.kernel_io.map_batch import BatchMap
    table = BatchMap(probes.bpf["req_agg"], "req_agg")
    assert (ct.sizeof(table.Key), ct.sizeof(table.Leaf)) == (KEY.size, VALUE.size) == (ct.sizeof(AggKey),
                                                                                       ct.sizeof(AggValue))
    keys, values = table.packed()
    assert len(keys) % KEY.size == 0 and len(keys) // KEY.size == len(values) // VALUE.size
