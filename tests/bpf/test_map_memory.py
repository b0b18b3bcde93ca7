"""The loaded program's kernel memory (issue 45): at most 64 MB on a 224-CPU node, projected
from the maps the kernel made here (kernel_io/map_memory.py); every per-CPU map and block
counted at that CPU count. The tables made by need are charged what they hold (empty here),
and their full size is printed beside, not asserted."""
from __future__ import annotations

from otel_gpu.kernel_io.map_memory import NODE_CPUS, program_maps, summary

TARGET_MB = 64


def test_the_maps_fit_a_224_cpu_node(probes):
    maps = program_maps(probes.bpf)
    names = {m.name for m in maps}
    assert {"rollup", "conns", "req_agg", "events", "launch_slots"} <= names  # the program's, not another's
    s = summary(maps, NODE_CPUS)
    print(f"kernel maps: {s['mb']} MB here ({s['cpus']} CPUs); {s['node_mb']} MB at {NODE_CPUS} CPUs, "
          f"{s['node_full_mb']} MB with every table made by need full; largest: {s['largest']}")
    assert s["node_mb"] <= TARGET_MB, s
    # no per-CPU hash sized for the worst case is left: the big tables are made by need
    big = [m for m in maps if m.max_entries >= 65536 and m.type in (1, 5)]
    assert big and all(m.by_need for m in big), [(m.name, m.flags) for m in big]
