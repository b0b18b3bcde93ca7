"""Collector-side cost of one CUDA ring-buffer record in Python: the product's
decode() (ctypes from_buffer_copy) against a single struct.unpack_from of the same
layout, building the same CudaCall. `python -m bench.decode_speed` prints records/s."""
from __future__ import annotations

import ctypes as ct
import struct
import time

from otel_gpu.pipeline.events import EV_CUDA, CudaCall, CudaEvent, decode

# events.h cuda_event: header (kind, pad[3], tgid, tid, pad2, ts_ns), call, ret, func,
# grid[3], block[3], shmem, stream, bytes, kind, pad, duration_ns
CUDA = struct.Struct("<B3xIIxxxxQIiQ3I3IQQQI4xQ")


def unpack(buf: bytes) -> CudaCall:
    (_, tgid, tid, ts, call, ret, func, g0, g1, g2, b0, b1, b2, shmem, stream, nbytes, kind,
     dur) = CUDA.unpack_from(buf)
    return CudaCall(tgid, tid, ts, call, ret, func, (g0, g1, g2), (b0, b1, b2), shmem, stream, nbytes,
                    kind, dur)


def rate(fn, buf: bytes, n: int) -> float:
    t0 = time.perf_counter()
    for _ in range(n):
        fn(buf)
    return n / (time.perf_counter() - t0)


def main(n: int = 200_000) -> dict:
    assert CUDA.size == ct.sizeof(CudaEvent)
    e = CudaEvent()
    e.h.kind, e.h.tgid, e.h.tid, e.h.ts_ns, e.call, e.func = EV_CUDA, 42, 43, 123456789, 1, 0xdead
    e.grid[:] = (64, 1, 1)
    buf = bytes(e)
    assert decode(buf) == unpack(buf)
    out = {"decode_per_s": rate(decode, buf, n), "struct_unpack_per_s": rate(unpack, buf, n),
           "string_at_plus_decode_per_s": rate(lambda b: decode(ct.string_at(b, len(b))), buf, n)}
    print({k: f"{v:,.0f}" for k, v in out.items()})
    return out


if __name__ == "__main__":
    main()
