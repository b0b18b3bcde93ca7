"""LaunchSlots (the reader of bpf/launch_slots.c) on memory laid out as the kernel's
array, and RollupReader adding its counts to the rollup hash's."""
from __future__ import annotations

import ctypes as ct

from otel_gpu.kernel_io.abi import SLOT_CLAIMING, LaunchSlot, RollupKey, RollupValue
from otel_gpu.kernel_io.launch_slots import LaunchSlots
from otel_gpu.kernel_io.reader import LAUNCH_KERNEL, RollupReader

ENTRIES = 8


def memory():
    return (LaunchSlot * ENTRIES)()


def test_deltas_per_process_and_kernel_summed_over_slots():
    mem, traced = memory(), {10, 20}
    slots = LaunchSlots(mem, ENTRIES, traced.__contains__)
    mem[0] = LaunchSlot(tgid=10, func=0xA, count=5)
    mem[5] = LaunchSlot(tgid=10, func=0xA, count=2)  # the same kernel on another CPU
    mem[3] = LaunchSlot(tgid=20, func=0xB, count=1)
    assert slots.read() == {(10, 0xA): 7, (20, 0xB): 1}
    assert slots.read() == {}  # nothing new
    mem[0].count = 9
    assert slots.read() == {(10, 0xA): 4}


def test_untraced_owners_and_free_slots_are_skipped():
    mem, traced = memory(), {10}
    slots = LaunchSlots(mem, ENTRIES, traced.__contains__)
    mem[1] = LaunchSlot(tgid=30, func=0xC, count=4)  # released (or never user-traced)
    mem[2] = LaunchSlot(tgid=0, func=0xD, count=6)   # free, or claimed halfway
    assert slots.read() == {}


def test_a_slot_being_taken_is_read_once_its_new_owner_is_written():
    """The kernel's claim: SLOT_CLAIMING, func and count, then the tgid. Halfway, the
    fields are the new owner's or the old one's: the slot is not read, whoever is traced."""
    mem = memory()
    slots = LaunchSlots(mem, ENTRIES, lambda _tgid: True)
    mem[6] = LaunchSlot(tgid=SLOT_CLAIMING, func=0xA, count=1)
    assert slots.read() == {}
    mem[6].tgid = 12
    assert slots.read() == {(12, 0xA): 1}


def test_a_slot_taken_over_counts_for_its_new_owner_from_zero():
    mem, traced = memory(), {10}
    slots = LaunchSlots(mem, ENTRIES, traced.__contains__)
    mem[4] = LaunchSlot(tgid=10, func=0xA, count=50)
    assert slots.read() == {(10, 0xA): 50}
    traced.discard(10)  # released once its last counts were read
    traced.add(11)
    mem[4] = LaunchSlot(tgid=11, func=0xE, count=3)
    assert slots.read() == {(11, 0xE): 3}


def test_a_reused_pid_that_launches_the_same_kernel_continues_the_count():
    mem, traced = memory(), {10}
    slots = LaunchSlots(mem, ENTRIES, traced.__contains__)
    mem[4] = LaunchSlot(tgid=10, func=0xA, count=50)
    assert slots.read() == {(10, 0xA): 50}
    mem[4].count = 53  # a new process with pid 10: its own 3 launches
    assert slots.read() == {(10, 0xA): 3}


class FakeRollupTable:
    """items() as bcc's hash gives them: (key, value)."""

    def __init__(self, rows):
        self.rows = rows

    def items(self):
        return self.rows


def test_rollup_reader_adds_slot_counts_to_the_hash_ones():
    mem = memory()
    mem[0] = LaunchSlot(tgid=10, func=0xA, count=7)
    mem[1] = LaunchSlot(tgid=10, func=0xF, count=2)  # only in a slot
    key = RollupKey(tgid=10, call=LAUNCH_KERNEL, detail=0xA)
    table = FakeRollupTable([(key, RollupValue(count=4))])
    reader = RollupReader(table, LaunchSlots(mem, ENTRIES, {10}.__contains__))
    got = {(r.tgid, r.call, r.detail): r.count for r in reader.read(1000)}
    assert got == {(10, LAUNCH_KERNEL, 0xA): 11, (10, LAUNCH_KERNEL, 0xF): 2}
    assert reader.read(2000) == []


def test_memory_mirrors_the_kernel_layout():
    assert ct.sizeof(LaunchSlot) == 24 and LaunchSlot.count.offset == 16
