"""The sizes bpf/launch_slots.c is compiled with (a block of slots per possible CPU);
kernel_io/launch_slots.py maps and reads the array they give."""
from __future__ import annotations

import logging
import os

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
