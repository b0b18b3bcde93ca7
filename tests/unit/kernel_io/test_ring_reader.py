"""kernel_io/reader.py RingReader: batches bounded, and what a full one says of the ring
buffer left unread (kernel_io/program.py sheds per-request counts past half of it)."""
from __future__ import annotations

import ctypes as ct
import types

import pytest

from otel_gpu.kernel_io import reader
from otel_gpu.ratelimit import Stats


class FakeRing:
    """bcc's ring buffer calls: each poll hands its records to the callback, as libbpf does,
    until the callback asks it to stop."""

    def __init__(self) -> None:
        self.pending: list[int] = []  # records' timestamps, 100 bytes each

    def __getitem__(self, _name):
        return self

    def open_ring_buffer(self, callback) -> None:
        self.callback = callback

    def ring_buffer_poll(self, _timeout_ms) -> None:
        while self.pending:
            raw = ct.create_string_buffer(self.pending.pop(0).to_bytes(8, "little") + bytes(92), 100)
            if self.callback(None, ct.addressof(raw), 100) < 0:
                return


@pytest.fixture
def ring(monkeypatch):
    monkeypatch.setattr(reader, "decode", lambda raw: types.SimpleNamespace(ts_ns=int.from_bytes(raw[:8], "little")))
    bpf = FakeRing()
    return bpf, reader.RingReader(bpf, "events", Stats(), max_batch=4)


def test_a_full_batch_tells_how_much_it_left_behind(ring):
    bpf, r = ring
    bpf.pending = [0, 1000, 2000, 3000, 4000, 5000]  # 400 bytes made over 3,000 ns: 2 more wait
    batch, _ = r.poll(0)
    assert [b.ts_ns for b in batch] == [0, 1000, 2000, 3000] and r.full
    assert r.unread(33_000) == pytest.approx(4000)  # 30,000 ns since the newest at 400 / 3,000 a ns
    r.size = 8000
    assert not r.half_full(33_000) and r.half_full(33_001)
    batch, _ = r.poll(0)
    assert len(batch) == 2 and not r.full and r.unread(99_000) == 0  # caught up: nothing estimated
