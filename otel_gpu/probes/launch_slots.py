"""The kernel side's sizes of bpf/launch_slots.c and its memory mapping, which the
pipeline's LaunchSlots reads (pipeline/launch_slots.py)."""
from __future__ import annotations

import ctypes as ct
import logging
import mmap
import os

from ..pipeline.abi import LaunchSlot
from ..pipeline.launch_slots import LaunchSlots

log = logging.getLogger(__name__)

SLOTS_LOG2 = 9  # bpf/launch_slots.c LAUNCH_SLOTS_LOG2 (passed as a -D flag)
SLOTS_PER_CPU = 1 << SLOTS_LOG2


def possible_cpus(path: str = "/sys/devices/system/cpu/possible") -> int:
    """Ids bpf_get_smp_processor_id() can return: the highest possible CPU + 1."""
    try:
        with open(path) as f:
            return int(f.read().strip().replace(",", "-").split("-")[-1]) + 1
    except (OSError, ValueError) as e:
        n = os.cpu_count() or 1
        log.warning("cannot read %s (%s): launch slots for %d CPUs, the others count in the rollup hash", path, e, n)
        return n


def map_memory(table, cpus: int) -> mmap.mmap:
    """The launch_slots array's memory, shared with the kernel (BPF_F_MMAPABLE), read-only."""
    size = cpus * SLOTS_PER_CPU * ct.sizeof(LaunchSlot)
    size = -(-size // mmap.PAGESIZE) * mmap.PAGESIZE
    return mmap.mmap(table.map_fd, size, mmap.MAP_SHARED, mmap.PROT_READ)


def reader(bpf, cpus: int, traced) -> LaunchSlots:
    """The pipeline's reader of the loaded program's slots; `traced(tgid)`: user space
    traces tgid (pid_bits.PidBits.traced)."""
    return LaunchSlots(map_memory(bpf["launch_slots"], cpus), cpus * SLOTS_PER_CPU, traced)
