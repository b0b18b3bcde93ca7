"""bpf/launch_slots.c: the launch fast path counts a traced process's kernels in per-CPU
slots, and in the rollup hash where a slot is taken; read together as the collector
reads them, every kernel's count is exact. A slot held by a process that exited and
was released is taken over, and neither process's counts move."""
from __future__ import annotations

import ctypes as ct
import os
import sys

from otel_gpu.kernel_io.abi import SLOT_CLAIMING, LaunchSlot
from otel_gpu.kernel_io import launch_slots
from otel_gpu.probes.pid_bits import TRACED
from otel_gpu.cuda_calls import BY_NAME, RUNTIME
from tests.bpf.probe_harness import LAUNCH_CHILD_HEAD, Child

LAUNCH = BY_NAME["cudaLaunchKernel"].id
KERNELS = 3 * launch_slots.SLOTS_PER_CPU  # more kernels than a CPU has slots: some must collide

# `launch K`: kernel i (a distinct host-stub address) launched i % 5 + 1 times, i < K.
CHILD = LAUNCH_CHILD_HEAD + r'''
print(json.dumps({"cudart": path}), flush=True)
for line in sys.stdin:
    k = int(line.split()[1])
    for i in range(k):
        for _ in range(i % 5 + 1):
            rt.cudaLaunchKernel(0x400000 + 48 * i, Dim3(1, 1, 1), Dim3(32, 1, 1), None, 0, None)
    print("{}", flush=True)
'''


def expected(k: int) -> dict:
    return {(LAUNCH, 0x400000 + 48 * i): i % 5 + 1 for i in range(k)}


def counted(probes, pid: int) -> dict:
    return {key: n for key, (n, _bytes, _ns) in probes.rollup(pid).items() if key[0] == LAUNCH}


def slot_owners(probes) -> dict:
    """tgid -> slots it holds, read from the mapped array."""
    memory = launch_slots.map_memory(probes.bpf["launch_slots"], probes.cpus)
    entries = probes.cpus * launch_slots.SLOTS_PER_CPU
    slots = (LaunchSlot * entries).from_buffer_copy(memory[:entries * ct.sizeof(LaunchSlot)])
    owners: dict = {}
    for s in slots:
        if s.tgid:
            owners[s.tgid] = owners.get(s.tgid, 0) + 1
    return owners


def in_hash(probes, pid: int) -> int:
    return sum(1 for k in probes.bpf["rollup"].keys() if k.tgid == pid and k.call == LAUNCH)


def traced_child(probes, cpu: int | None = None) -> Child:
    """A child traced as the collector's trace() does; on one CPU when `cpu` is given."""
    c = Child([sys.executable, "-c", CHILD])
    if cpu is not None:
        os.sched_setaffinity(c.pid, {cpu})
    assert probes.attach(RUNTIME, c.hello["cudart"], c.pid) > 0
    probes.set("traced", c.pid, ct.c_uint32(TRACED))  # as the collector's trace(): user space's TRACED bit
    return c


def test_every_kernel_counts_exactly_across_slots_and_the_hash(probes):
    c = traced_child(probes)
    try:
        c.run(f"launch {KERNELS}")
        assert counted(probes, c.pid) == expected(KERNELS)
        # Both paths took part: slots held, and kernels whose slot was taken in the hash.
        assert slot_owners(probes).get(c.pid, 0) > 0
        assert in_hash(probes, c.pid) > 0
        c.run(f"launch {KERNELS}")  # the second read gives the new launches only
        assert counted(probes, c.pid) == {k: 2 * n for k, n in expected(KERNELS).items()}
    finally:
        c.stop()
        probes.unset("traced", c.pid)


def test_slots_of_a_released_process_are_taken_over(probes):
    cpu = min(os.sched_getaffinity(0))  # slots are per CPU: both children on the same one
    a = traced_child(probes, cpu)
    a.run("launch 200")
    a.stop()
    final_a = counted(probes, a.pid)  # read after its exit, as the collector's ProcExit read
    assert final_a == expected(200)
    held_by_a = slot_owners(probes).get(a.pid, 0)
    assert held_by_a > 0
    probes.unset("traced", a.pid)  # forget(): user space releases it after that read

    # b launches enough kernels to reach nearly every slot of the CPU: 200 would not do
    # when the pids are consecutive, as on a quiet host, where these stubs hashed with
    # the two pids fall in disjoint slots (the index xors stub and pid).
    b = traced_child(probes, cpu)
    try:
        b.run(f"launch {KERNELS}")
        assert counted(probes, b.pid) == expected(KERNELS)
        owners = slot_owners(probes)
        assert owners.get(b.pid, 0) > 0
        assert owners.get(a.pid, 0) < held_by_a  # b took slots a held
        assert counted(probes, a.pid) == final_a  # a released: nothing more read for it
    finally:
        b.stop()
        probes.unset("traced", b.pid)


def test_a_slot_being_taken_is_left_to_its_claimer(probes):
    """A writer preempted halfway through a claim (a preemptible kernel runs uprobe
    programs with migration disabled only) leaves SLOT_CLAIMING in the slot: every other
    launch on that CPU counts in the hash meanwhile, exactly, and none in the slot."""
    cpu = min(os.sched_getaffinity(0))
    table = probes.bpf["launch_slots"]
    first = cpu * launch_slots.SLOTS_PER_CPU
    for i in range(first, first + launch_slots.SLOTS_PER_CPU):
        table[ct.c_int(i)] = table.Leaf(SLOT_CLAIMING, 0, 0)
    c = traced_child(probes, cpu)
    try:
        c.run("launch 200")
        assert counted(probes, c.pid) == expected(200)
        assert in_hash(probes, c.pid) == 200 and c.pid not in slot_owners(probes)
        assert all(table[ct.c_int(i)].tgid == SLOT_CLAIMING for i in range(first, first + launch_slots.SLOTS_PER_CPU))
    finally:
        c.stop()
        probes.unset("traced", c.pid)
        for i in range(first, first + launch_slots.SLOTS_PER_CPU):
            table[ct.c_int(i)] = table.Leaf(0, 0, 0)
