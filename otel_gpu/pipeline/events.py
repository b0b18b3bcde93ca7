"""The ctypes mirror of bpf/events.h, and the decoder from ring-buffer bytes to
Python records. tests/unit/test_event_layout.py checks every size and offset
against the C header compiled with -Wpadded."""
from __future__ import annotations

import ctypes as ct
import struct
from dataclasses import dataclass
from typing import Optional, Union

HTTP_DATA_CAP = 1024
HTTP_TAIL_CAP = 8

EV_ACCEPT, EV_SOCK_READ, EV_SOCK_WRITE, EV_SOCK_CLOSE, EV_CUDA, EV_PROC_EXIT = 1, 2, 3, 4, 5, 6

# enum cuda_call
CALL_LAUNCH_KERNEL = 1
CALL_LAUNCH_KERNEL_EXC = 2
CALL_MEMCPY = 3
CALL_MEMCPY_ASYNC = 4
CALL_MALLOC = 5
CALL_FREE = 6
CALL_STREAM_SYNC = 7
CALL_DEVICE_SYNC = 8
CALL_EVENT_SYNC = 9
CALL_GRAPH_LAUNCH = 10
CALL_CU_LAUNCH_KERNEL = 11
CALL_CU_LAUNCH_KERNEL_EX = 12
CALL_SET_DEVICE = 13

CALL_NAMES = {
    CALL_LAUNCH_KERNEL: "cudaLaunchKernel",
    CALL_LAUNCH_KERNEL_EXC: "cudaLaunchKernelExC",
    CALL_MEMCPY: "cudaMemcpy",
    CALL_MEMCPY_ASYNC: "cudaMemcpyAsync",
    CALL_MALLOC: "cudaMalloc",
    CALL_FREE: "cudaFree",
    CALL_STREAM_SYNC: "cudaStreamSynchronize",
    CALL_DEVICE_SYNC: "cudaDeviceSynchronize",
    CALL_EVENT_SYNC: "cudaEventSynchronize",
    CALL_GRAPH_LAUNCH: "cudaGraphLaunch",
    CALL_CU_LAUNCH_KERNEL: "cuLaunchKernel",
    CALL_CU_LAUNCH_KERNEL_EX: "cuLaunchKernelEx",
    CALL_SET_DEVICE: "cudaSetDevice",
}
LAUNCH_CALLS = frozenset({CALL_LAUNCH_KERNEL, CALL_LAUNCH_KERNEL_EXC, CALL_CU_LAUNCH_KERNEL,
                          CALL_CU_LAUNCH_KERNEL_EX, CALL_GRAPH_LAUNCH})
KERNEL_LAUNCH_CALLS = LAUNCH_CALLS - {CALL_GRAPH_LAUNCH}
MEMCPY_CALLS = frozenset({CALL_MEMCPY, CALL_MEMCPY_ASYNC})
SYNC_CALLS = frozenset({CALL_STREAM_SYNC, CALL_DEVICE_SYNC, CALL_EVENT_SYNC})
MEMCPY_DIRECTIONS = {0: "h2h", 1: "h2d", 2: "d2h", 3: "d2d", 4: "default"}

# enum counter
CNT_RINGBUF_FULL, CNT_CUDA_STREAMED, CNT_DRIVER_DEDUPED, CNT_CONN_TABLE_FULL = range(4)
COUNTER_NAMES = ("ringbuf_full", "cuda_streamed", "driver_deduped", "conn_table_full")


class EventHeader(ct.Structure):
    _fields_ = [("kind", ct.c_uint8), ("pad", ct.c_uint8 * 3), ("tgid", ct.c_uint32),
                ("tid", ct.c_uint32), ("pad2", ct.c_uint32), ("ts_ns", ct.c_uint64)]


class AcceptEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("fd", ct.c_int32), ("listen_fd", ct.c_int32),
                ("family", ct.c_uint16), ("peer_port", ct.c_uint16),
                ("peer_addr", ct.c_uint8 * 16), ("pad", ct.c_uint32)]


class SockIoEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("fd", ct.c_int32), ("data_len", ct.c_uint32),
                ("ret", ct.c_int64), ("tail_len", ct.c_uint32), ("pad", ct.c_uint32),
                ("tail", ct.c_uint8 * HTTP_TAIL_CAP), ("data", ct.c_uint8 * HTTP_DATA_CAP)]


class CloseEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("fd", ct.c_int32), ("pad", ct.c_uint32)]


class CudaEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("call", ct.c_uint32), ("ret", ct.c_int32),
                ("func", ct.c_uint64), ("grid", ct.c_uint32 * 3), ("block", ct.c_uint32 * 3),
                ("shmem", ct.c_uint64), ("stream", ct.c_uint64), ("bytes", ct.c_uint64),
                ("kind", ct.c_uint32), ("pad", ct.c_uint32), ("duration_ns", ct.c_uint64)]


class ProcExitEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("comm", ct.c_char * 16)]


class RollupKey(ct.Structure):
    _fields_ = [("tgid", ct.c_uint32), ("call", ct.c_uint32), ("func", ct.c_uint64)]


class RollupValue(ct.Structure):
    _fields_ = [("count", ct.c_uint64), ("bytes", ct.c_uint64), ("duration_ns", ct.c_uint64)]


# Python records handed down the pipeline. Plain slotted dataclasses: cheap to build.
@dataclass(slots=True)
class Accept:
    tgid: int
    tid: int
    ts_ns: int
    fd: int
    listen_fd: int
    peer_addr: Optional[str]
    peer_port: Optional[int]


@dataclass(slots=True)
class SockIo:
    kind: int  # EV_SOCK_READ or EV_SOCK_WRITE
    tgid: int
    tid: int
    ts_ns: int
    fd: int
    ret: int
    data: bytes
    tail: bytes


@dataclass(slots=True)
class SockClose:
    tgid: int
    tid: int
    ts_ns: int
    fd: int


@dataclass(slots=True)
class CudaCall:
    tgid: int
    tid: int
    ts_ns: int
    call: int
    ret: int
    func: int
    grid: tuple
    block: tuple
    shmem: int
    stream: int
    bytes: int
    kind: int
    duration_ns: int

    @property
    def name(self) -> str:
        return CALL_NAMES.get(self.call, f"cuda_call_{self.call}")


@dataclass(slots=True)
class ProcExit:
    tgid: int
    ts_ns: int
    comm: str = ""


Event = Union[Accept, SockIo, SockClose, CudaCall, ProcExit]


class DecodeError(ValueError):
    """A record that does not match the header: counted and dropped by the reader."""


_HEADER_SIZE = ct.sizeof(EventHeader)
_IO_FIXED = SockIoEvent.data.offset


def _addr(family: int, raw) -> Optional[str]:
    import ipaddress
    if family == 2:
        return str(ipaddress.IPv4Address(bytes(raw[:4])))
    if family == 10:
        a = ipaddress.IPv6Address(bytes(raw))
        return str(a.ipv4_mapped or a)
    return None


# The hot record decoded with one precompiled unpack (4-5x faster than ctypes
# from_buffer_copy); tests/unit/test_event_layout.py checks it against CudaEvent.
CUDA_STRUCT = struct.Struct("<B3xII4xQ" "IiQ" "3I3I" "QQQ" "I4xQ")


def decode(buf) -> Event:
    """Turn one ring-buffer record (bytes or any buffer) into a Python record;
    DecodeError on bad input."""
    size = len(buf)
    if size < _HEADER_SIZE:
        raise DecodeError(f"record of {size} bytes is shorter than the header")
    kind = buf[0] if isinstance(buf[0], int) else ord(buf[0])
    if kind == EV_CUDA:
        if size < CUDA_STRUCT.size:
            raise DecodeError(f"CudaEvent needs {CUDA_STRUCT.size} bytes, got {size}")
        (_, tgid, tid, ts, call, ret, func, g0, g1, g2, b0, b1, b2, shmem, stream, nbytes, mkind,
         duration) = CUDA_STRUCT.unpack_from(buf)
        return CudaCall(tgid, tid, ts, call, ret, func, (g0, g1, g2), (b0, b1, b2), shmem, stream,
                        nbytes, mkind, duration)
    buf = bytes(buf)
    if kind in (EV_SOCK_READ, EV_SOCK_WRITE):
        if size < _IO_FIXED or size > ct.sizeof(SockIoEvent):
            raise DecodeError(f"socket record of {size} bytes")
        padded = bytes(buf) + bytes(ct.sizeof(SockIoEvent) - size)
        e = SockIoEvent.from_buffer_copy(padded)
        if e.data_len > HTTP_DATA_CAP or _IO_FIXED + e.data_len > size or e.tail_len > HTTP_TAIL_CAP:
            raise DecodeError(f"socket record claims {e.data_len} data bytes in {size}")
        data = bytes(buf[_IO_FIXED:_IO_FIXED + e.data_len])
        return SockIo(kind, e.h.tgid, e.h.tid, e.h.ts_ns, e.fd, e.ret, data, bytes(e.tail[:e.tail_len]))
    if kind == EV_ACCEPT:
        _need(buf, AcceptEvent)
        e = AcceptEvent.from_buffer_copy(buf)
        port = int.from_bytes(e.peer_port.to_bytes(2, "little"), "big") if e.family else None
        return Accept(e.h.tgid, e.h.tid, e.h.ts_ns, e.fd, e.listen_fd, _addr(e.family, e.peer_addr), port)
    if kind == EV_SOCK_CLOSE:
        _need(buf, CloseEvent)
        e = CloseEvent.from_buffer_copy(buf)
        return SockClose(e.h.tgid, e.h.tid, e.h.ts_ns, e.fd)
    if kind == EV_PROC_EXIT:
        _need(buf, ProcExitEvent)
        e = ProcExitEvent.from_buffer_copy(buf)
        return ProcExit(e.h.tgid, e.h.ts_ns, e.comm.decode(errors="replace"))
    raise DecodeError(f"unknown event kind {kind}")


def _need(buf: bytes, struct) -> None:
    if len(buf) < ct.sizeof(struct):
        raise DecodeError(f"{struct.__name__} needs {ct.sizeof(struct)} bytes, got {len(buf)}")
