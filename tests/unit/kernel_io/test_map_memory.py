"""Kernel memory of the BPF maps at another CPU count (kernel_io/map_memory.py): only the
per-CPU part grows; a table made by need is charged what it holds, and `full` bounds it."""
from otel_gpu.kernel_io.map_memory import ELEM_HEADER, MapMemory, summary

PERCPU_HASH, HASH, LRU_HASH, ARRAY = 5, 1, 9, 2


def test_a_preallocated_per_cpu_hash_grows_with_the_cpus():
    # the rollup table as it was: 65536 x 24 B per CPU, plus its elements (8 MB on 2 CPUs)
    rollup = MapMemory("rollup", PERCPU_HASH, 65536, 16, 24, 0, 8_913_792)
    per_cpu = 65536 * 24 * 2
    assert rollup.per_cpu(2) == per_cpu
    assert rollup.at(224, 2) == 8_913_792 - per_cpu + 65536 * 24 * 224  # 358 MB: what issue 45 measured
    assert round(rollup.at(224, 2) / 1e6) == 358
    assert rollup.full(224, 2) == rollup.at(224, 2)  # preallocated: full from the start


def test_arrays_of_a_block_per_cpu_grow_and_other_maps_do_not():
    slots = MapMemory("launch_slots", ARRAY, 2 * 512, 4, 24, 0, 24_576)
    assert slots.at(224, 2) == 24_576 * 112
    lru = MapMemory("go_wakes", LRU_HASH, 65536, 24, 1, 0, 6_292_352)
    assert lru.at(224, 2) == lru.full(224, 2) == 6_292_352


def test_a_table_made_by_need_counts_what_it_holds_and_is_bounded_when_full():
    conns = MapMemory("conns", HASH, 65536, 8, 80, 1, 1_050_000)  # empty: its buckets
    assert conns.by_need and conns.at(224, 2) == 1_050_000
    assert conns.full(224, 2) == 1_050_000 + 65536 * (ELEM_HEADER + 8 + 80)
    assert not MapMemory("traced", HASH, 4096, 4, 4, 0, 1).by_need


def test_the_summary_adds_them_up():
    maps = [MapMemory("events", 27, 8 << 20, 0, 0, 0, 8_433_992),
            MapMemory("launch_slots", ARRAY, 1024, 4, 24, 0, 24_576)]
    s = summary(maps, cpus=224)
    assert s["node_cpus"] == 224 and s["mb"] == round((8_433_992 + 24_576) / 1e6, 1)
    assert list(s["largest"]) == ["events", "launch_slots"]
