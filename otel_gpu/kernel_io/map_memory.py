"""Kernel memory of the collector's BPF maps: what the kernel charges each map now (its
fdinfo `memlock`, read from the program's descriptors in this process), and what the same maps
would hold on a node with more CPUs.

Only per-CPU memory grows with the CPU count: the values of per-CPU maps (one copy per
possible CPU) and the arrays sized with a block per CPU (bpf/launch_slots.c). A hash made
by need (maps.h BY_NEED) is charged for the entries it holds, so its figure is a reading
at that moment; `full` says what it would hold with every entry made (the kernel's
element layout: a 48-byte header, key and value rounded to 8 bytes; LRU hashes and
preallocated ones are charged in full from the start). `otel-gpu status` shows them and
bench item 4 measures them."""
from __future__ import annotations

import re
from dataclasses import dataclass

from ..probes.launch_slot_sizes import possible_cpus

PER_CPU_TYPES = frozenset((5, 6, 10))  # BPF_MAP_TYPE_PERCPU_HASH, PERCPU_ARRAY, LRU_PERCPU_HASH
HASH_TYPES = frozenset((1, 5, 9, 10))  # HASH, PERCPU_HASH, LRU_HASH, LRU_PERCPU_HASH
PER_CPU_BLOCKS = frozenset(("launch_slots",))  # arrays of a block per possible CPU (LAUNCH_CPUS)
NO_PREALLOC = 1  # BPF_F_NO_PREALLOC
ELEM_HEADER = 48  # struct htab_elem before its key (hash node, lru/free list, hash), rounded
NODE_CPUS = 224   # the node the issue sizes for: a DGX H100 (2 x 56 cores x 2 threads)
_FDINFO = re.compile(r"^(\w+):\s+(\S+)", re.M)


def _round8(n: int) -> int:
    return (n + 7) & ~7


@dataclass(frozen=True)
class MapMemory:
    name: str
    type: int
    max_entries: int
    key_size: int
    value_size: int
    flags: int
    memlock: int  # bytes the kernel charges it now

    @property
    def by_need(self) -> bool:
        return self.type in HASH_TYPES and bool(self.flags & NO_PREALLOC)

    def per_cpu(self, cpus: int) -> int:
        """Of memlock, the bytes held once per CPU (with `cpus` possible CPUs)."""
        if self.name in PER_CPU_BLOCKS:
            return self.memlock
        if self.type in PER_CPU_TYPES and not self.by_need:
            return self.max_entries * _round8(self.value_size) * cpus
        return 0

    def at(self, cpus: int, here: int) -> int:
        """memlock on a host with `cpus` possible CPUs (this one has `here`)."""
        scaled = self.per_cpu(here)
        return self.memlock - scaled + scaled * cpus // max(here, 1)

    def full(self, cpus: int, here: int) -> int:
        """The bytes with every entry made (a hash made by need, full), at `cpus` CPUs."""
        if not self.by_need:
            return self.at(cpus, here)
        value = _round8(self.value_size) * (cpus if self.type in PER_CPU_TYPES else 1)
        return self.memlock + self.max_entries * (ELEM_HEADER + _round8(self.key_size) + value)


def program_maps(bpf, info_dir: str = "/proc/self/fdinfo") -> list[MapMemory]:
    """The maps of one loaded program (bcc's BPF or a CachedBPF), from this process's
    descriptors of them."""
    from ..probes.cached_bpf import map_fds, map_name  # bcc: only where there is a program
    out = []
    for fd in sorted(map_fds(bpf)):
        try:
            with open(f"{info_dir}/{fd}") as f:
                info = dict(_FDINFO.findall(f.read()))
        except OSError:  # closed meanwhile
            continue
        out.append(MapMemory(map_name(fd) or f"id {info.get('map_id')}", int(info["map_type"]),
                             int(info["max_entries"]), int(info["key_size"]), int(info["value_size"]),
                             int(info.get("map_flags", "0"), 16), int(info.get("memlock", 0))))
    return out


def summary(maps: list, cpus: int = NODE_CPUS) -> dict:
    """What `otel-gpu status` shows: MB now, at `cpus` CPUs, and with every table made by
    need full there; the largest maps at `cpus` CPUs."""
    here = possible_cpus()
    mb = lambda n: round(n / 1e6, 1)  # noqa: E731
    largest = sorted(maps, key=lambda m: m.at(cpus, here), reverse=True)[:5]
    return {"mb": mb(sum(m.memlock for m in maps)), "cpus": here, "node_cpus": cpus,
            "node_mb": mb(sum(m.at(cpus, here) for m in maps)),
            "node_full_mb": mb(sum(m.full(cpus, here) for m in maps)),
            "largest": {m.name: mb(m.at(cpus, here)) for m in largest}}
