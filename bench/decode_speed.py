"""Collector-side cost of one CUDA launch record (the hot ring-buffer record) in
Python: the product's decode() on bytes and on the zero-copy ctypes view the reader
hands it, against ctypes from_buffer_copy building the same LaunchCall.
`python -m bench.decode_speed` prints records/s (best of 3 runs: the figure is noisy
on a shared machine)."""
from __future__ import annotations

import ctypes as ct
import time

from otel_gpu.kernel_io.abi import EV_CUDA_LAUNCH, LaunchEvent
from otel_gpu.kernel_io.decode import decode
from otel_gpu.records import LaunchCall


def via_ctypes(buf: bytes) -> LaunchCall:
    e = LaunchEvent.from_buffer_copy(buf)
    h = e.c.h
    return LaunchCall(h.tgid, h.tid, h.ts_ns, e.c.call, e.c.ret, e.func, tuple(e.dims.grid),
                      tuple(e.dims.block), e.shmem, e.stream)


def rate(fn, buf, n: int) -> float:
    best = 0.0
    for _ in range(3):
        t0 = time.perf_counter()
        for _ in range(n):
            fn(buf)
        best = max(best, n / (time.perf_counter() - t0))
    return best


def main(n: int = 200_000) -> dict:
    e = LaunchEvent()
    e.c.h.kind, e.c.h.tgid, e.c.h.tid, e.c.h.ts_ns, e.c.call, e.func = EV_CUDA_LAUNCH, 42, 43, 123456789, 1, 0xdead
    e.dims.grid[:] = (64, 1, 1)
    buf = bytes(e)
    view = (ct.c_char * len(buf)).from_buffer_copy(buf)  # what RingReader passes
    assert decode(buf) == decode(view) == via_ctypes(buf)
    out = {"decode_per_s": rate(decode, buf, n), "decode_view_per_s": rate(decode, view, n),
           "ctypes_per_s": rate(via_ctypes, buf, n)}
    print({k: f"{v:,.0f}" for k, v in out.items()})
    return out


if __name__ == "__main__":
    main()
