"""bpf/launch_slots.c from user space: the array's memory mapping (its sizes are the
program's: probes/launch_slot_sizes.py), and the reader of the launches the fast path counted per CPU slot, as deltas per (tgid, kernel)
since the last read, for RollupReader to add to the `rollup` hash's counts (a launch is
counted in one of the two, never both).

The slots are read from the array's memory as the kernel writes them: each slot's
tgid first, then its func and count (the order the kernel's claim is safe against);
a slot being taken (SLOT_CLAIMING) is read at the next poll.
A slot counts for the process that holds it; one held by a process user space does
not trace (anymore) is skipped: that is the owner a slot is taken from, and its last
counts were read before user space released it."""
from __future__ import annotations

import ctypes as ct
import mmap
from typing import Callable

from ..probes.launch_slot_sizes import SLOTS_PER_CPU
from .abi import SLOT_CLAIMING, LaunchSlot

def map_memory(table, cpus: int) -> mmap.mmap:
    """The launch_slots array's memory, shared with the kernel (BPF_F_MMAPABLE), read-only."""
    size = cpus * SLOTS_PER_CPU * ct.sizeof(LaunchSlot)
    size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    return mmap.mmap(table.map_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)


def reader(bpf, cpus: int, traced) -> LaunchSlots:
    """The pipeline's reader of the loaded program's slots; `traced(tgid)`: user space
    traces tgid (pid_bits.PidBits.traced)."""
    return LaunchSlots(map_memory(bpf["launch_slots"], cpus), cpus * SLOTS_PER_CPU, traced)


WORDS = ct.sizeof(LaunchSlot) // 8  # u64 words per slot: tgid, func, count


class LaunchSlots:
    def __init__(self, memory, entries: int, traced: Callable[[int], bool]) -> None:
        """`memory`: the array's mapping (entries slots); `traced(tgid)`: user space
        traces tgid (its TRACED bit is set in pid_bits)."""
        self.words = memoryview(memory).cast("B").cast("Q")[:entries * WORDS]
        self.traced = traced
        self._seen: dict[int, tuple[int, int, int]] = {}  # slot -> (tgid, func, count) last read

    def read(self) -> dict[tuple[int, int], int]:
        """(tgid, func) -> launches counted since the last read."""
        w, out = self.words, {}
        heads = w[::WORDS].tolist()  # every tgid before any func or count
        for i in [i for i, head in enumerate(heads) if head]:  # most slots are free
            tgid = heads[i]
            if tgid == SLOT_CLAIMING or not self.traced(tgid):  # being taken: read at the next poll
                continue
            func, count = w[i * WORDS + 1], w[i * WORDS + 2]
            seen = self._seen.get(i)
            n = count - seen[2] if seen and seen[0] == tgid and seen[1] == func else count
            if n <= 0:
                continue
            self._seen[i] = (tgid, func, count)
            out[tgid, func] = out.get((tgid, func), 0) + n
        return out
