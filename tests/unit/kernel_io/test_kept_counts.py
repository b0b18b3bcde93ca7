"""kernel_io/kept_counts.py: req_agg rows kept packed until the stream reaches their epoch's end."""
from __future__ import annotations

import ctypes as ct

from otel_gpu.kernel_io.abi import AggKey, AggValue
from otel_gpu.kernel_io.kept_counts import EPOCH_WORD, KEY, KEY_WORDS, ROW, TGID_WORD, VALUE, KeptCounts


def _row(tgid, epoch, n):
    """Every field at a value its type can hold but a narrower one could not."""
    key = (tgid, 0xFFFF_FFF0 + n % 8, epoch, 0x8000_0003, 0x7F12_3456_789A_BC00 + n, 0xFFFF_FFFF_FFFF_0000 + n)
    value = (n + 1, 1 << 40, 1 << 50, 2 ** 63 + n, 2 ** 64 - 1 - n, 2 ** 62 + n)
    return key, value


def test_a_row_is_its_key_and_value_fields_in_order():
    assert [f for f, _ in AggKey._fields_] == ["tgid", "tid", "epoch", "call", "detail", "ctx"]
    assert ROW.size == 80 and ROW.size == ct.sizeof(AggKey) + ct.sizeof(AggValue)
    assert len(AggValue._fields_) == 6
    assert (KEY.size, VALUE.size) == (ct.sizeof(AggKey), ct.sizeof(AggValue))
    # the reader's columns: the tgid and the epoch, u32 words 0 and 2 of each key
    assert (AggKey.tgid.offset, AggKey.epoch.offset, KEY_WORDS * 4) == (0, 8, ct.sizeof(AggKey))
    keys = b"".join(KEY.pack(*k) for k, _ in (_row(7, 21, 0), _row(9, 0xFFFF_FFFF, 1)))
    words = memoryview(keys).cast("I")
    assert words[TGID_WORD::KEY_WORDS].tolist() == [7, 9] and words[EPOCH_WORD::KEY_WORDS].tolist() == [21, 0xFFFF_FFFF]


def _keep(kept, rows):
    """rows added as a read of req_agg gives them: packed, with their columns."""
    keys, values = b"".join(KEY.pack(*k) for k, _ in rows), b"".join(VALUE.pack(*v) for _, v in rows)
    kept.add(keys, values, list(range(len(rows))), [k[0] for k, _ in rows], [k[2] for k, _ in rows])


def test_rows_come_back_exact_the_due_ones_only_in_the_order_kept():
    kept = KeptCounts(limit=10)
    rows = [_row(7, e, n) for n, e in enumerate((5, 3, 9, 4, 12))] + [_row(8, 2, 99)]
    _keep(kept, rows)
    assert kept.n == 6 and kept.room() == 4 and sorted(kept.tgids()) == [7, 8]
    flat = [k + v for k, v in rows]
    assert kept.take(7, lambda e: e < 6) == [flat[0], flat[1], flat[3]]
    assert kept.n == 3 and kept.take(7, lambda e: e < 6) == []
    assert kept.take(7, lambda e: True) == [flat[2], flat[4]] and 7 not in kept.tgids()
    kept.forget(8)
    assert kept.n == 0 and not kept and kept.take(8, lambda e: True) == []


def test_only_the_rows_named_are_kept_each_whole():
    """A read keeps some of its rows (the others taken now or left in the table)."""
    kept = KeptCounts(limit=10)
    rows = [_row(7, e, n) for n, e in enumerate((5, 3, 9, 4))]
    keys, values = b"".join(KEY.pack(*k) for k, _ in rows), b"".join(VALUE.pack(*v) for _, v in rows)
    kept.add(keys, values, [1, 3], [7] * 4, [5, 3, 9, 4])
    assert kept.n == 2 and kept.take(7, lambda e: True) == [rows[1][0] + rows[1][1], rows[3][0] + rows[3][1]]
