"""kernel_io/map_batch.py on a real BPF hash map in the kernel: the batch commands read
every entry and delete exactly the keys asked, a key already gone is reported so and
does not stop the rest."""
from __future__ import annotations

import ctypes as ct
import errno
import logging
import struct

import pytest

from otel_gpu.kernel_io import map_batch
from otel_gpu.kernel_io.map_batch import BatchMap

PROGRAM = """
struct k { u32 a; u32 b; u64 c; };
struct v { u64 n; u64 m; };
BPF_HASH(m, struct k, struct v, 4096);
int noop(void *ctx) { struct k key = {}; m.lookup(&key); return 0; }
"""


@pytest.fixture(scope="module")
def table():
    from bcc import BPF

    from otel_gpu.probes.source import kernel_headers_hint
    kernel_headers_hint()  # bcc needs a header tree even for this
    bpf = BPF(text=PROGRAM.encode())
    yield bpf["m"]
    bpf.cleanup()


def fill(table, n):
    table.clear()
    for i in range(n):
        table[table.Key(i, i * 7, i << 33)] = table.Leaf(i + 1, 2 * i)


@pytest.mark.parametrize("n", [0, 1, 3000, 4096])
def test_items_reads_every_entry_exactly(table, n):
    fill(table, n)
    got = {(k.a, k.b, k.c): (v.n, v.m) for k, v in BatchMap(table, "m").items()}
    assert got == {(i, i * 7, i << 33): (i + 1, 2 * i) for i in range(n)}


KEY, VALUE = struct.Struct("@IIQ"), struct.Struct("@QQ")  # PROGRAM's struct k and struct v


@pytest.mark.parametrize("batched", [True, False])
def test_packed_reads_the_kernels_bytes_and_delete_takes_keys_as_bytes(table, batched):
    """packed(): every key and every value back to back as the kernel lays them out,
    batched or entry by entry; keys packed alike delete as ctypes keys do."""
    fill(table, 300)
    bm = BatchMap(table, "m")
    bm._batched = batched
    keys, values = bm.packed()
    rows = list(zip(KEY.iter_unpack(keys), VALUE.iter_unpack(values)))
    assert sorted(rows) == [((i, i * 7, i << 33), (i + 1, 2 * i)) for i in range(300)]
    assert bm.delete(b"".join(KEY.pack(*k) for k, _ in rows if k[0] < 100)) == [True] * 100
    assert sorted(k.a for k in table.keys()) == list(range(100, 300))


def test_delete_removes_the_keys_asked_and_reports_one_already_gone(table):
    fill(table, 2000)
    bm = BatchMap(table, "m")
    keys = [k for k, _ in bm.items() if k.a % 2 == 0]
    gone = keys[10]
    del table[table.Key(gone.a, gone.b, gone.c)]  # another reader took it first
    done = bm.delete(keys)
    assert done == [k is not keys[10] for k in keys]
    assert sorted(k.a for k in table.keys()) == list(range(1, 2000, 2))
    assert bm._batched  # the kernel's batch commands did it (no per-entry fallback)


def test_items_are_copies_that_survive_the_next_read(table):
    fill(table, 5)
    bm = BatchMap(table, "m")
    first = bm.items()
    table.clear()
    table[table.Key(99, 0, 0)] = table.Leaf(1, 1)
    bm.items()
    assert sorted(k.a for k, _ in first) == [0, 1, 2, 3, 4]


def test_a_kernel_refusing_the_batch_commands_is_logged_by_map_name_and_read_entry_by_entry(table, monkeypatch,
                                                                                             caplog):
    """Linux < 5.6 (or a map type without them) answers EINVAL: the map is read and
    cleared through bcc's per-entry calls from then on, with one warning naming it."""
    class Refusing:
        @staticmethod
        def bpf_lookup_batch(*_args):
            ct.set_errno(errno.EINVAL)
            return -1

        bpf_delete_batch = bpf_lookup_batch

    fill(table, 50)
    monkeypatch.setattr(map_batch, "lib", Refusing)
    bm = BatchMap(table, "m")
    with caplog.at_level(logging.WARNING, logger=map_batch.__name__):
        keys, _values = bm.packed()
    rows = [k for (k,) in zip(KEY.iter_unpack(keys))]
    assert sorted(k[0] for k in rows) == list(range(50)) and not bm._batched
    assert [r.getMessage() for r in caplog.records] == ["m: batch lookup refused ([Errno 22] BPF_MAP_LOOKUP_BATCH: "
                                                        "EINVAL): reading entry by entry"]
    bm = BatchMap(table, "m")
    with caplog.at_level(logging.WARNING, logger=map_batch.__name__):
        assert bm.delete(b"".join(KEY.pack(*k) for k in rows if k[0] < 20)) == [True] * 20
    assert caplog.records[-1].getMessage() == "m: batch delete refused (EINVAL): deleting entry by entry"
    assert sorted(k.a for k in table.keys()) == list(range(20, 50))


def test_items_and_delete_of_a_map_whose_key_is_not_all_integers():
    """items() and delete() take any key, as ctypes keys."""
    from bcc import BPF

    from otel_gpu.probes.source import kernel_headers_hint
    kernel_headers_hint()
    bpf = BPF(text=b"""
struct k { u32 a; char name[8]; };
BPF_HASH(n, struct k, u64, 64);
int noop(void *ctx) { struct k key = {}; n.lookup(&key); return 0; }
""")
    try:
        table = bpf["n"]
        for i in range(10):
            table[table.Key(i, b"x%d" % i)] = ct.c_uint64(i)
        bm = BatchMap(table, "n")
        keys = [k for k, _ in bm.items()]
        assert len(keys) == 10 and bm.delete(keys[:4]) == [True] * 4 and len(table) == 6
    finally:
        bpf.cleanup()
