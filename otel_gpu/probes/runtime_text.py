"""Where a process's CUDA runtime code lies, for the exact runtime/driver
de-duplication in the kernel (bpf/cuda_probes.c `from_runtime`): a driver launch
(cuLaunchKernel*) whose return address lies in these ranges was called by libcudart,
so it is a runtime launch passing through libcuda, already counted by the runtime
probe. Any other caller (cuBLAS, cuDNN, NCCL, Triton: they reach the driver from their
own code, cuBLAS through its own static copy of cudart) launches on its own.

The ranges are the executable mappings of the files discovery probes as the runtime:
each libcudart the process maps, and its executable when cudart is linked into it
statically. Written per process at every scan that finds them changed."""
from __future__ import annotations

import ctypes as ct
import logging

log = logging.getLogger(__name__)

MAX_RANGES = 4  # RUNTIME_RANGES in bpf/cuda_probes.c
DELETED = " (deleted)"


def runtime_ranges(maps_text: str, paths: set) -> list[tuple[int, int]]:
    """[start, end) of every executable mapping of the files `paths` (as the process
    sees them: its libcudart files, its executable if cudart is linked in) in
    /proc/<pid>/maps text, sorted."""
    out = []
    for line in maps_text.splitlines():
        parts = line.split(None, 5)
        if len(parts) < 6 or "x" not in parts[1]:
            continue
        path = parts[5].removesuffix(DELETED)
        if path not in paths:
            continue
        start, _, end = parts[0].partition("-")
        try:
            out.append((int(start, 16), int(end, 16)))
        except ValueError:
            continue
    return sorted(out)


def write(table, pid: int, ranges: list[tuple[int, int]]) -> None:
    """The process's entry in the `runtime_text` map; more than MAX_RANGES (a process
    with that many runtimes loaded) keeps the first ones, logged: the launches of the
    others' kernels would then count twice."""
    if len(ranges) > MAX_RANGES:
        log.warning("pid %d maps %d CUDA runtime code ranges; only %d are known to the driver launch "
                    "probes: launches through the others count twice", pid, len(ranges), MAX_RANGES)
    leaf = table.Leaf()
    for i, (lo, hi) in enumerate(ranges[:MAX_RANGES]):
        leaf.lo[i], leaf.hi[i] = lo, hi
    table[ct.c_uint32(pid)] = leaf
