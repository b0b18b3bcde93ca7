"""Ring-buffer bytes -> pipeline records (records.py).

Each CUDA shape is decoded by one precompiled struct.Struct (several times faster
than ctypes from_buffer_copy; launches are the hot path); tests/unit/test_event_layout.py
checks every Struct against its ctypes mirror in kernel_io/abi.py. Socket reads and writes
(two a request) are variable-length: a Struct decodes their fixed part. The rarer shapes
go through the mirror."""
from __future__ import annotations

import ctypes as ct
import ipaddress
import struct
from typing import Optional

from ..records import (Accept, ContextCopy, CudaCall, DeviceActivity, DeviceCall, DeviceRecords, GoH2Unit, LibraryLoaded, GraphCall, GraphOp, H2Digest, KernelHandle,
                       LaunchCall, MemcpyCall, MemoryCall, NcclCall, ProcExit, SockClose, SockIo, SyncCall, UnitWake)
from . import abi
from .abi import (EV_ACCEPT, EV_CUDA_DEVICE, EV_CUDA_GRAPH, EV_CUDA_LAUNCH, EV_CUDA_MEMCPY, EV_CUDA_MEMORY,
                  EV_CUDA_SYNC, EV_PROC_EXIT, EV_FLAG_UNREADABLE, EV_PY_CONTEXT, EV_SOCK_CLOSE, EV_SOCK_READ,
                  EV_SOCK_WRITE, HTTP_DATA_CAP, HTTP_TAIL_CAP)
from .abi import (EV_FLAG_CAPTURE, EV_FLAG_HTTP_UNSEEN, EV_FLAG_REQ_START, EV_FLAG_TLS, EV_GO_H2_UNIT, EV_GO_SPAWN,
                  EV_GO_WAKE, EV_GRAPH_OP, EV_KERNEL_HANDLE, EV_NCCL)
from .abi import EV_DEVICE_RECORDS, EV_FLAG_H2_DIGEST, EV_LIBRARY_LOADED, EV_FLAG_TIMES, H2_DIGEST_CAP, H2_DIGEST_HEAD, H2_PIECE_HEAD


_FLAGS = struct.Struct("<B")  # event_header.flags, at offset 1


class DecodeError(ValueError):
    """A record that does not match the header: counted and dropped by the reader."""


# struct cuda_header: kind, flags, pad[2], tgid, tid, epoch (0: unused), ts_ns, call, ret, ctx
_CUDA_HEADER = "<BBxxII4xQIiQ"
LAUNCH = struct.Struct(_CUDA_HEADER + "Q3I3IQQ")  # func, grid, block, shmem, stream
MEMCPY = struct.Struct(_CUDA_HEADER + "QQI4x")    # bytes, stream, direction, pad
MEMORY = struct.Struct(_CUDA_HEADER + "QQQ")      # ptr, bytes, duration_ns
SYNC = struct.Struct(_CUDA_HEADER + "QQ")         # handle, duration_ns
GRAPH = struct.Struct(_CUDA_HEADER + "QQ")        # graph_exec, stream
DEVICE = struct.Struct(_CUDA_HEADER + "I4x")      # device, pad
GRAPH_OP = struct.Struct(_CUDA_HEADER + "QQQ")    # stream, graph, graph_exec
# count, bytes, comm, stream, group, datatype, redop, peer, nranks, rank, pad
NCCL = struct.Struct(_CUDA_HEADER + "QQQQQIIiIi4x")
PY_CONTEXT = struct.Struct("<B3xIIIQQQ")          # header (epoch kept), ctx, parent (and the Go unit records)
GO_H2 = struct.Struct("<B3xIIIQQQI4x")            # header (epoch kept), unit, conn, stream, pad
# kernel_handle_event up to its name: header, call, ret, handle, source, name_len, pad
KERNEL_HANDLE = struct.Struct("<BBxxII4xQIiQQI4x")
# A socket record's fixed part (header, fd, data_len, ret, ctx, tail_len, lost, draw, times,
# tail); its data follows, data_len bytes of it.
SOCK_IO = struct.Struct("<BBxxIIIQiIqQIIQ4Q%ds" % HTTP_TAIL_CAP)
# device_records_event: header, count, pad, dropped; then DEVICE_RECORDS_PER_CALL of
# device_record: start, end, api_ns, bytes, correlation id, tid, stream, device, kind, copy
# kind, api domain, pad, api id, pad.
DEVICE_RECORDS = struct.Struct("<BBxxII4xQI4xQ")
DEVICE_RECORD = struct.Struct("<QQQQIIIIBBBxI8x")
_PIECE = struct.Struct("<IH")  # an HTTP/2 digest piece's head: offset in the transfer, length

# Each Struct beside the ctypes mirror it must match (checked by the layout test).
STRUCT_MIRRORS = ((LAUNCH, abi.LaunchEvent), (MEMCPY, abi.MemcpyEvent), (MEMORY, abi.MemoryEvent),
                  (SYNC, abi.SyncEvent), (GRAPH, abi.GraphEvent), (DEVICE, abi.DeviceEvent), (NCCL, abi.NcclEvent),
                  (GRAPH_OP, abi.GraphOpEvent),
                  (PY_CONTEXT, abi.PyContextEvent), (GO_H2, abi.GoH2Event), (DEVICE_RECORD, abi.DeviceRecord))

_HEADER_SIZE = ct.sizeof(abi.EventHeader)
_IO_FIXED = abi.SockIoEvent.data.offset
_IO_SIZE = ct.sizeof(abi.SockIoEvent)
_LAUNCH_SIZE = LAUNCH.size
_unpack_launch = LAUNCH.unpack_from


def _exact(buf, size: int, s: struct.Struct, what: str):
    if size != s.size:
        raise DecodeError(f"{what} record needs {s.size} bytes, got {size}")
    return s.unpack_from(buf)


def _memcpy(buf, size):
    _, flags, tgid, tid, ts, call, ret, ctx, nbytes, stream, direction = _exact(buf, size, MEMCPY, "memcpy")
    return MemcpyCall(tgid, tid, ts, call, ret, nbytes, direction, stream, ctx=ctx,
                      unreadable=bool(flags & EV_FLAG_UNREADABLE))


def _memory(buf, size):
    _, flags, tgid, tid, ts, call, ret, ctx, ptr, nbytes, duration = _exact(buf, size, MEMORY, "memory")
    return MemoryCall(tgid, tid, ts, call, ret, ptr, nbytes, duration, ctx=ctx,
                      unreadable=bool(flags & EV_FLAG_UNREADABLE))


def _sync(buf, size):
    _, _flags, tgid, tid, ts, call, ret, ctx, handle, duration = _exact(buf, size, SYNC, "sync")
    return SyncCall(tgid, tid, ts, call, ret, handle, duration, ctx=ctx)


def _graph(buf, size):
    _, _flags, tgid, tid, ts, call, ret, ctx, graph_exec, stream = _exact(buf, size, GRAPH, "graph")
    return GraphCall(tgid, tid, ts, call, ret, graph_exec, stream, ctx=ctx)


def _graph_op(buf, size):
    _, flags, tgid, tid, ts, call, ret, _ctx, stream, graph, graph_exec = _exact(buf, size, GRAPH_OP, "graph op")
    return GraphOp(tgid, tid, ts, call, ret, stream, graph, graph_exec, unreadable=bool(flags & EV_FLAG_UNREADABLE))


def _device(buf, size):
    _, _flags, tgid, tid, ts, call, ret, ctx, device = _exact(buf, size, DEVICE, "device")
    return DeviceCall(tgid, tid, ts, call, ret, device, ctx=ctx)


def _nccl(buf, size):
    (_, flags, tgid, tid, ts, call, ret, ctx, count, nbytes, comm, stream, group, datatype, redop, peer, nranks,
     rank) = _exact(buf, size, NCCL, "NCCL")
    return NcclCall(tgid, tid, ts, call, ret, count, nbytes, datatype, redop, peer, comm, nranks, rank, stream,
                    group, ctx=ctx, unreadable=bool(flags & EV_FLAG_UNREADABLE))


def _device_records(buf, size):
    if size != ct.sizeof(abi.DeviceRecordsEvent):
        raise DecodeError(f"device records need {ct.sizeof(abi.DeviceRecordsEvent)} bytes, got {size}")
    _, flags, tgid, _tid, ts, count, dropped = DEVICE_RECORDS.unpack_from(buf)
    if count > abi.DEVICE_RECORDS_PER_CALL:
        raise DecodeError(f"{count} device records in a batch of {abi.DEVICE_RECORDS_PER_CALL}")
    out = []
    for i in range(count):
        (start, end, api_ns, nbytes, corr, tid, stream, device, kind, _copy, domain,
         api_id) = DEVICE_RECORD.unpack_from(buf, DEVICE_RECORDS.size + i * DEVICE_RECORD.size)
        out.append(DeviceActivity(kind, start, end, api_ns, tid, (domain, api_id), corr, stream, device, nbytes))
    return DeviceRecords(tgid, ts, tuple(out), dropped, bool(flags & EV_FLAG_UNREADABLE))


def _library_loaded(buf, size):
    if size != _HEADER_SIZE:
        raise DecodeError(f"library-loaded record needs {_HEADER_SIZE} bytes, got {size}")
    return LibraryLoaded(abi.EventHeader.from_buffer_copy(bytes(buf)).tgid)


def _py_context(buf, size):
    _, tgid, tid, epoch, ts, ctx, parent = _exact(buf, size, PY_CONTEXT, "Python context")
    return ContextCopy(tgid, tid, ts, ctx, parent, epoch)


def _go_spawn(buf, size):
    _, tgid, tid, epoch, ts, goroutine, creator = _exact(buf, size, PY_CONTEXT, "goroutine start")
    return ContextCopy(tgid, tid, ts, goroutine, creator, epoch)


def _go_wake(buf, size):
    _, tgid, tid, epoch, ts, woken, waker = _exact(buf, size, PY_CONTEXT, "goroutine wake-up")
    return UnitWake(tgid, tid, ts, woken, waker, epoch)


def _go_h2(buf, size):
    _, tgid, tid, epoch, ts, unit, conn, stream = _exact(buf, size, GO_H2, "Go HTTP/2 goroutine")
    return GoH2Unit(tgid, tid, ts, unit, conn, stream, epoch)


def _kernel_handle(buf, size):
    fixed = KERNEL_HANDLE.size
    if size < fixed:
        raise DecodeError(f"kernel handle record needs {fixed} bytes, got {size}")
    _, flags, tgid, tid, ts, call, ret, handle, source, name_len = KERNEL_HANDLE.unpack_from(buf)
    if name_len >= abi.KERNEL_NAME_CAP or fixed + name_len != size:
        raise DecodeError(f"kernel handle record claims a {name_len}-byte name in {size}")
    name = bytes(buf[fixed:size]).decode(errors="replace") if name_len else None
    return KernelHandle(tgid, tid, ts, call, ret, handle, source, name,
                        cut=name_len == abi.KERNEL_NAME_CAP - 1, unreadable=bool(flags & EV_FLAG_UNREADABLE))


def _addr(family: int, raw) -> Optional[str]:
    if family == 2:
        return str(ipaddress.IPv4Address(bytes(raw[:4])))
    if family == 10:
        a = ipaddress.IPv6Address(bytes(raw))
        return str(a.ipv4_mapped or a)
    return None


def _need(buf, size: int, mirror) -> None:
    if size < ct.sizeof(mirror):
        raise DecodeError(f"{mirror.__name__} needs {ct.sizeof(mirror)} bytes, got {size}")


def _sock_io(buf, size):
    if size < _IO_FIXED:
        raise DecodeError(f"socket record of {size} bytes")
    (kind, flags, tgid, tid, epoch, ts, fd, data_len, ret, ctx, tail_len, lost, draw, on_cpu, cpu_wait, gpu_sync,
     blocked, tail) = SOCK_IO.unpack_from(buf)
    cap = H2_DIGEST_CAP if flags & EV_FLAG_H2_DIGEST else HTTP_DATA_CAP
    if size > _IO_FIXED + cap:
        raise DecodeError(f"socket record of {size} bytes")
    if data_len > cap or _IO_FIXED + data_len > size or tail_len > HTTP_TAIL_CAP:
        raise DecodeError(f"socket record claims {data_len} data bytes in {size}")
    data = bytes(buf[_IO_FIXED:_IO_FIXED + data_len])
    digest = None
    if flags & EV_FLAG_H2_DIGEST:
        digest = _h2_digest(data, ret)
        data = digest.pieces[0][1] if digest.pieces and digest.pieces[0][0] == 0 else b""
    times = (on_cpu, cpu_wait, gpu_sync, blocked) if flags & EV_FLAG_TIMES else None
    return SockIo(kind, tgid, tid, ts, fd, ret, data, tail[:tail_len], ctx, epoch, bool(flags & EV_FLAG_TLS), lost,
                  bool(flags & EV_FLAG_REQ_START), draw, digest, times)


def _h2_digest(data: bytes, ret: int) -> H2Digest:
    """An HTTP/2 digest record's data (bpf/events.h): its stop cause, whether more records
    follow, then pieces (u32 offset, u16 length, bytes) in order within the transfer."""
    if len(data) < H2_DIGEST_HEAD:
        raise DecodeError("HTTP/2 digest without its head")
    pieces, i, end = [], H2_DIGEST_HEAD, -1
    while i < len(data):
        if i + H2_PIECE_HEAD > len(data):
            raise DecodeError("HTTP/2 digest piece cut")
        at, n = _PIECE.unpack_from(data, i)
        i += H2_PIECE_HEAD
        if n == 0 or i + n > len(data) or at < end or at + n > ret:
            raise DecodeError(f"HTTP/2 digest piece of {n} bytes at {at} does not fit")
        pieces.append((at, data[i:i + n]))
        i, end = i + n, at + n
    return H2Digest(tuple(pieces), bool(data[1]), data[0])


def _accept(buf, size):
    _need(buf, size, abi.AcceptEvent)
    e = abi.AcceptEvent.from_buffer_copy(bytes(buf))
    port = int.from_bytes(e.peer_port.to_bytes(2, "little"), "big") if e.family else None
    return Accept(e.h.tgid, e.h.tid, e.h.ts_ns, e.fd, e.listen_fd, _addr(e.family, e.peer_addr), port,
                  tracked=not e.flags & abi.ACCEPT_UNTRACKED, inode=e.ino or None)


def _close(buf, size):
    _need(buf, size, abi.CloseEvent)
    e = abi.CloseEvent.from_buffer_copy(bytes(buf))
    return SockClose(e.h.tgid, e.h.tid, e.h.ts_ns, e.fd, e.h.epoch, e.lost, e.ino or None)


def _proc_exit(buf, size):
    _need(buf, size, abi.ProcExitEvent)
    e = abi.ProcExitEvent.from_buffer_copy(bytes(buf))
    return ProcExit(e.h.tgid, e.h.ts_ns, e.comm.decode(errors="replace"))


_BY_KIND = {EV_CUDA_MEMCPY: _memcpy, EV_CUDA_MEMORY: _memory, EV_CUDA_SYNC: _sync,
            EV_CUDA_GRAPH: _graph, EV_CUDA_DEVICE: _device, EV_SOCK_READ: _sock_io,
            EV_SOCK_WRITE: _sock_io, EV_ACCEPT: _accept, EV_SOCK_CLOSE: _close,
            EV_PROC_EXIT: _proc_exit, EV_GRAPH_OP: _graph_op, EV_PY_CONTEXT: _py_context, EV_KERNEL_HANDLE: _kernel_handle,
            EV_NCCL: _nccl, EV_GO_SPAWN: _go_spawn, EV_GO_WAKE: _go_wake,
            EV_GO_H2_UNIT: _go_h2, EV_DEVICE_RECORDS: _device_records, EV_LIBRARY_LOADED: _library_loaded}
# Indexing bytes gives an int, a ctypes c_char array (the reader's zero-copy view)
# a 1-byte bytes: both spellings are keys, so one lookup serves either buffer.
_BY_KIND.update({bytes([k]): fn for k, fn in list(_BY_KIND.items())})
_LAUNCH_KINDS = (EV_CUDA_LAUNCH, bytes([EV_CUDA_LAUNCH]))


def decode(buf):
    """One ring-buffer record (bytes or any buffer) -> its record; DecodeError on bad
    input (unknown kind, short record, a length that does not fit its shape)."""
    size = len(buf)
    if size < _HEADER_SIZE:
        raise DecodeError(f"record of {size} bytes is shorter than the header")
    kind = buf[0]
    if kind in _LAUNCH_KINDS:  # the hot path, inline
        if size != _LAUNCH_SIZE:
            raise DecodeError(f"launch record needs {_LAUNCH_SIZE} bytes, got {size}")
        (_, flags, tgid, tid, ts, call, ret, ctx, func, g0, g1, g2, b0, b1, b2, shmem,
         stream) = _unpack_launch(buf)
        r = LaunchCall(tgid, tid, ts, call, ret, func, (g0, g1, g2), (b0, b1, b2), shmem, stream)
        r.ctx = ctx  # a keyword argument costs ~20% of the decode here; an attribute ~5%
        if flags:
            r.unreadable = bool(flags & EV_FLAG_UNREADABLE)  # the launch config or a stack argument
            r.capture = bool(flags & EV_FLAG_CAPTURE)  # its process had a stream capture open
            r.http_unseen = bool(flags & EV_FLAG_HTTP_UNSEEN)
        return r
    fn = _BY_KIND.get(kind)
    if fn is None:
        raise DecodeError(f"unknown event kind {kind!r}")
    r = fn(buf, size)
    if isinstance(r, CudaCall) and _FLAGS.unpack_from(buf, 1)[0] & EV_FLAG_HTTP_UNSEEN:
        r.http_unseen = True
    return r
