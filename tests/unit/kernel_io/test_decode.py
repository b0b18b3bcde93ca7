"""Ring-buffer records -> typed records (otel_gpu.pipeline.decode.decode)."""
import ctypes as ct
import socket

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from otel_gpu.kernel_io import abi
from otel_gpu.kernel_io.decode import SOCK_IO, DecodeError, decode
from otel_gpu.records import (Accept, ContextCopy, CudaCall, DeviceCall, GoH2Unit, GraphCall, LaunchCall, MemcpyCall,
                              MemoryCall, ProcExit, SockClose, SockIo, SyncCall)
from otel_gpu.cuda_calls import call_id

HEAD = (100, 101, 123456789)  # tgid, tid, ts_ns


def header(kind, tgid=100, tid=101, ts=123456789):
    return abi.EventHeader(kind=kind, tgid=tgid, tid=tid, ts_ns=ts)


def cuda(mirror, kind, call, ret=-1, ctx=0, **fields):
    return bytes(mirror(c=abi.CudaHeader(h=header(kind), call=call, ret=ret, ctx=ctx), **fields))


def view(buf: bytes):
    """What the reader passes: a ctypes array over the ring buffer's memory."""
    return (ct.c_char * len(buf)).from_buffer_copy(buf)


def accept_record(family, addr: bytes, port=8080):
    e = abi.AcceptEvent(h=header(abi.EV_ACCEPT), fd=7, listen_fd=3, family=family,
                        peer_port=socket.htons(port))
    ct.memmove(e.peer_addr, addr, len(addr))
    return bytes(e)


def io_record(kind, data: bytes, ret=None, tail=b"", ctx=0):
    e = abi.SockIoEvent(h=header(kind), fd=9, data_len=len(data),
                        ret=len(data) if ret is None else ret, tail_len=len(tail), ctx=ctx)
    ct.memmove(e.tail, tail, len(tail))
    ct.memmove(e.data, data, len(data))
    return bytes(e)[:abi.SockIoEvent.data.offset + len(data)]  # the probe sends only data_len bytes


def test_accept_ipv4():
    r = decode(accept_record(socket.AF_INET, socket.inet_aton("10.1.2.3"), 54321))
    assert r == Accept(100, 101, 123456789, 7, 3, "10.1.2.3", 54321)


def test_accept_ipv6_and_v4_mapped():
    r = decode(accept_record(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "2001:db8::1")))
    assert (r.peer_addr, r.peer_port) == ("2001:db8::1", 8080)
    r = decode(accept_record(socket.AF_INET6, socket.inet_pton(socket.AF_INET6, "::ffff:192.0.2.7")))
    assert r.peer_addr == "192.0.2.7"


def test_accept_without_address():
    r = decode(accept_record(0, b""))
    assert r.peer_addr is None and r.peer_port is None


@pytest.mark.parametrize("kind", [abi.EV_SOCK_READ, abi.EV_SOCK_WRITE])
def test_sock_io_variable_length(kind):
    data = b"GET / HTTP/1.1\r\n\r\n"
    r = decode(io_record(kind, data, ret=5000, tail=b"0\r\n\r\n"))
    assert r == SockIo(kind, 100, 101, 123456789, 9, 5000, data, b"0\r\n\r\n")
    assert decode(view(io_record(kind, data, ret=5000, tail=b"0\r\n\r\n"))) == r


def test_sock_io_every_fixed_field():
    """The Struct's fields are the mirror's: each set to a value no other field has."""
    h = abi.EventHeader(kind=abi.EV_SOCK_WRITE, flags=abi.EV_FLAG_TLS | abi.EV_FLAG_REQ_START, tgid=0x1111,
                        tid=0x2222, epoch=0x3333, ts_ns=0x4444_0000_0000)
    e = abi.SockIoEvent(h=h, fd=-7, data_len=3, ret=-0x5555_0000_0000, ctx=0x6666_0000_0000_0000, tail_len=2,
                        lost=0x7777, draw=0x8888_0000_0000_0001)
    ct.memmove(e.tail, b"\r\n", 2)
    ct.memmove(e.data, b"abc", 3)
    rec = bytes(e)[:abi.SockIoEvent.data.offset + 3]
    assert decode(view(rec)) == decode(rec) == SockIo(abi.EV_SOCK_WRITE, 0x1111, 0x2222, 0x4444_0000_0000, -7,
                                                      -0x5555_0000_0000, b"abc", b"\r\n", 0x6666_0000_0000_0000,
                                                      0x3333, True, 0x7777, True, 0x8888_0000_0000_0001)
    assert SOCK_IO.size == abi.SockIoEvent.data.offset


def test_sock_io_carries_the_python_context():
    r = decode(io_record(abi.EV_SOCK_WRITE, b"HTTP/1.1 200 OK\r\n", ctx=0x7F00DEAD0000))
    assert r.ctx == 0x7F00DEAD0000 and decode(io_record(abi.EV_SOCK_READ, b"x")).ctx == 0


def test_sock_io_from_the_ssl_probes_is_marked_tls():
    rec = bytearray(io_record(abi.EV_SOCK_READ, b"GET / HTTP/1.1\r\n"))
    assert decode(bytes(rec)).tls is False
    rec[abi.SockIoEvent.h.offset + abi.EventHeader.flags.offset] = abi.EV_FLAG_TLS
    assert decode(bytes(rec)).tls is True


def test_context_copy():
    h = header(abi.EV_PY_CONTEXT)
    h.epoch = 77  # a copy binds a context: it ends an epoch (bpf/maps.h epoch_submit)
    rec = bytes(abi.PyContextEvent(h=h, ctx=0x7F01, parent=0x7F02))
    assert decode(rec) == decode(view(rec)) == ContextCopy(*HEAD, 0x7F01, 0x7F02, 77)
    for bad in (rec[:-1], rec + bytes(8)):
        with pytest.raises(DecodeError):
            decode(bad)


def test_go_h2_unit():
    h = header(abi.EV_GO_H2_UNIT)
    h.epoch = 78  # a handler binds its goroutine: it ends an epoch too
    rec = bytes(abi.GoH2Event(h=h, unit=abi.GO_UNIT | 42, conn=0xC000_1000, stream=7))
    assert decode(rec) == decode(view(rec)) == GoH2Unit(*HEAD, abi.GO_UNIT | 42, 0xC000_1000, 7, 78)
    with pytest.raises(DecodeError):
        decode(rec[:-1])


def test_sock_io_full_cap_and_empty():
    assert decode(io_record(abi.EV_SOCK_READ, b"x" * abi.HTTP_DATA_CAP)).data == b"x" * 1024
    r = decode(io_record(abi.EV_SOCK_READ, b"", ret=-11))
    assert (r.data, r.ret) == (b"", -11)


def test_sock_io_claiming_more_data_than_sent():
    rec = bytearray(io_record(abi.EV_SOCK_READ, b"abc"))
    rec[abi.SockIoEvent.data_len.offset] = 200
    with pytest.raises(DecodeError):
        decode(bytes(rec))


def test_sock_io_bad_tail_len_and_short():
    rec = bytearray(io_record(abi.EV_SOCK_WRITE, b"abc"))
    rec[abi.SockIoEvent.tail_len.offset] = abi.HTTP_TAIL_CAP + 1
    with pytest.raises(DecodeError):
        decode(bytes(rec))
    with pytest.raises(DecodeError):
        decode(io_record(abi.EV_SOCK_READ, b"")[:-1])


def test_close_and_exit():
    assert decode(bytes(abi.CloseEvent(h=header(abi.EV_SOCK_CLOSE), fd=4))) == SockClose(100, 101, 123456789, 4)
    e = abi.ProcExitEvent(h=header(abi.EV_PROC_EXIT, tgid=55, ts=9), comm=b"python3")
    assert decode(bytes(e)) == ProcExit(55, 9, "python3")


def test_launch():
    rec = cuda(abi.LaunchEvent, abi.EV_CUDA_LAUNCH, call_id("cudaLaunchKernel"), func=0xDEAD,
               dims=abi.LaunchDims((ct.c_uint32 * 3)(4, 2, 1), (ct.c_uint32 * 3)(256, 1, 1)),
               shmem=48, stream=0x77)
    want = LaunchCall(*HEAD, 1, -1, 0xDEAD, (4, 2, 1), (256, 1, 1), 48, 0x77)
    assert decode(rec) == want and decode(view(rec)) == want and want.ctx == 0
    assert decode(rec).name == "cudaLaunchKernel" and decode(rec).amounts() == (0xDEAD, 0, 0)


@pytest.mark.parametrize("mirror,kind,call,fields,want", [
    (abi.MemcpyEvent, abi.EV_CUDA_MEMCPY, "cudaMemcpyAsync", dict(bytes=4096, stream=0x55, direction=2),
     MemcpyCall(*HEAD, 4, -1, 4096, 2, 0x55)),
    (abi.MemoryEvent, abi.EV_CUDA_MEMORY, "cudaMalloc", dict(ptr=0x7f00, bytes=1 << 20, duration_ns=900),
     MemoryCall(*HEAD, 5, -1, 0x7f00, 1 << 20, 900)),
    (abi.SyncEvent, abi.EV_CUDA_SYNC, "cudaStreamSynchronize", dict(handle=0x99, duration_ns=1500),
     SyncCall(*HEAD, 7, -1, 0x99, 1500)),
    (abi.GraphEvent, abi.EV_CUDA_GRAPH, "cudaGraphLaunch", dict(graph_exec=0xabc, stream=0x12),
     GraphCall(*HEAD, 10, -1, 0xabc, 0x12)),
    (abi.DeviceEvent, abi.EV_CUDA_DEVICE, "cudaSetDevice", dict(device=3),
     DeviceCall(*HEAD, 13, -1, 3)),
])
def test_each_cuda_shape(mirror, kind, call, fields, want):
    assert call_id(call) == want.call
    rec = cuda(mirror, kind, want.call, **fields)
    assert decode(rec) == want and decode(view(rec)) == want
    assert decode(rec).name == call



def test_return_code_is_signed():
    r = decode(cuda(abi.SyncEvent, abi.EV_CUDA_SYNC, call_id("cudaDeviceSynchronize"), ret=35))
    assert r.ret == 35 and r.handle == 0
    assert decode(cuda(abi.DeviceEvent, abi.EV_CUDA_DEVICE, 13, ret=-2)).ret == -2


def test_unknown_call_has_a_name():
    assert decode(cuda(abi.LaunchEvent, abi.EV_CUDA_LAUNCH, 99)).name == "cuda_call_99"


SHAPES = [(abi.LaunchEvent, abi.EV_CUDA_LAUNCH), (abi.MemcpyEvent, abi.EV_CUDA_MEMCPY),
          (abi.MemoryEvent, abi.EV_CUDA_MEMORY), (abi.SyncEvent, abi.EV_CUDA_SYNC),
          (abi.GraphEvent, abi.EV_CUDA_GRAPH), (abi.DeviceEvent, abi.EV_CUDA_DEVICE)]


@pytest.mark.parametrize("mirror,kind", SHAPES)
def test_every_cuda_shape_carries_the_python_context(mirror, kind):
    ctx = 0x7F12_3456_7890
    assert decode(cuda(mirror, kind, 1, ctx=ctx)).ctx == ctx
    assert decode(view(cuda(mirror, kind, 1, ctx=ctx))).ctx == ctx


@pytest.mark.parametrize("mirror,kind", SHAPES + [(abi.AcceptEvent, abi.EV_ACCEPT),
                                                  (abi.CloseEvent, abi.EV_SOCK_CLOSE),
                                                  (abi.PyContextEvent, abi.EV_PY_CONTEXT),
                                                  (abi.ProcExitEvent, abi.EV_PROC_EXIT)])
def test_short_records_rejected(mirror, kind):
    rec = bytes([kind]) + bytes(ct.sizeof(mirror) - 1)
    with pytest.raises(DecodeError):
        decode(rec[:-1])
    with pytest.raises(DecodeError):
        decode(view(rec[:-1]))


@pytest.mark.parametrize("mirror,kind", SHAPES)
def test_cuda_record_of_another_shape_rejected(mirror, kind):
    """A CUDA record is exactly its shape's size: a longer one is a layout mismatch."""
    with pytest.raises(DecodeError):
        decode(bytes([kind]) + bytes(ct.sizeof(mirror) + 7))


@pytest.mark.parametrize("buf", [b"", b"\x05", bytes(15), bytes([0]) + bytes(40), bytes([13]) + bytes(40),
                                 bytes([255]) + bytes(100)])
def test_garbage_rejected(buf):
    with pytest.raises(DecodeError):
        decode(buf)
    with pytest.raises(DecodeError):
        decode(view(buf))


def test_oversized_socket_record_is_a_decode_error():
    with pytest.raises(DecodeError):
        decode(io_record(abi.EV_SOCK_READ, b"x" * abi.HTTP_DATA_CAP) + b"\0" * 8)


@settings(max_examples=2500, deadline=None, database=None)
@given(st.sampled_from(range(0, 14)), st.binary(max_size=ct.sizeof(abi.SockIoEvent) + 8))
def test_random_bytes_decode_or_raise_decode_error(kind, rest):
    buf = bytes([kind]) + rest
    try:
        r = decode(buf)
    except DecodeError:
        return
    assert isinstance(r, (Accept, SockIo, SockClose, CudaCall, ContextCopy, ProcExit))
    assert decode(view(buf)) == r
    if isinstance(r, SockIo):
        assert len(r.data) <= abi.HTTP_DATA_CAP and len(r.tail) <= abi.HTTP_TAIL_CAP


@settings(max_examples=300, deadline=None, database=None)
@given(st.sampled_from(SHAPES), st.data())
def test_valid_cuda_records_of_every_size_decode(shape, data):
    """Every record of the right size and kind decodes, whatever its field values."""
    mirror, kind = shape
    buf = bytes([kind]) + data.draw(st.binary(min_size=ct.sizeof(mirror) - 1, max_size=ct.sizeof(mirror) - 1))
    r = decode(buf)
    assert isinstance(r, CudaCall) and r.tgid == abi.EventHeader.from_buffer_copy(buf).tgid


def test_unreadable_flag_is_decoded_for_launches_and_copies():
    def flagged(rec: bytes) -> bytes:
        b = bytearray(rec)
        b[abi.EventHeader.flags.offset] = abi.EV_FLAG_UNREADABLE
        return bytes(b)
    launch = cuda(abi.LaunchEvent, abi.EV_CUDA_LAUNCH, call_id("cudaLaunchKernelExC"), func=0x10)
    assert decode(launch).unreadable is False
    assert decode(view(flagged(launch))).unreadable is True
    copy = cuda(abi.MemcpyEvent, abi.EV_CUDA_MEMCPY, call_id("cudaMemcpy2DAsync"), bytes=64)
    assert decode(copy).unreadable is False and decode(flagged(copy)).unreadable is True
    alloc = cuda(abi.MemoryEvent, abi.EV_CUDA_MEMORY, call_id("cudaMalloc"), bytes=64)
    assert decode(flagged(alloc)).unreadable is True


def test_device_records_batch_every_field_and_only_count_of_them():
    e = abi.DeviceRecordsEvent(h=header(abi.EV_DEVICE_RECORDS), count=2, dropped=5)
    for i in range(abi.DEVICE_RECORDS_PER_CALL):  # past count: never read
        e.records[i] = abi.DeviceRecord(start_ns=1000 * i + 1, end_ns=1000 * i + 2, api_ns=1000 * i, bytes=64 * i,
                                        correlation_id=7 + i, tid=300 + i, stream_id=9, device_id=1, kind=1 + i % 3,
                                        api_domain=2, api_id=211)
    batch = decode(view(bytes(e)))
    assert (batch.tgid, batch.ts_ns, batch.dropped, batch.unreadable) == (100, 123456789, 5, False)
    assert [(a.kind, a.start_ns, a.end_ns, a.api_ns, a.tid, a.api, a.correlation_id, a.stream_id, a.device_id,
             a.bytes) for a in batch.activities] == [(1, 1, 2, 0, 300, (2, 211), 7, 9, 1, 0),
                                                     (2, 1001, 1002, 1000, 301, (2, 211), 8, 9, 1, 64)]
    e.count = abi.DEVICE_RECORDS_PER_CALL + 1
    with pytest.raises(DecodeError):
        decode(view(bytes(e)))
    with pytest.raises(DecodeError):
        decode(view(bytes(e)[:-1]))


def test_library_loaded_is_a_bare_header():
    from otel_gpu.records import LibraryLoaded
    assert decode(view(bytes(header(abi.EV_LIBRARY_LOADED)))) == LibraryLoaded(100)
    with pytest.raises(DecodeError):
        decode(view(bytes(header(abi.EV_LIBRARY_LOADED)) + b"\0"))
