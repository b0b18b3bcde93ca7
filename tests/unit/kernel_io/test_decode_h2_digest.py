"""HTTP/2 digest records (bpf/h2_walk.c, EV_FLAG_H2_DIGEST): the pieces come out as the
kernel laid them (offset in the transfer, bytes), up to H2_DIGEST_CAP bytes of data; a
piece that does not fit its record or its transfer is a decode error."""
from __future__ import annotations

import struct

import pytest

from otel_gpu.kernel_io import abi
from otel_gpu.kernel_io.decode import DecodeError, decode

FIXED = abi.SockIoEvent.data.offset


def digest_record(pieces, ret: int, more: int = 0, stop: int = 0, kind: int = abi.EV_SOCK_READ) -> bytes:
    data = bytes([stop, more]) + b"".join(struct.pack("<IH", at, len(b)) + b for at, b in pieces)
    head = abi.SockIoEvent(fd=5, data_len=len(data), ret=ret)
    head.h.kind, head.h.flags, head.h.tgid, head.h.tid = kind, abi.EV_FLAG_H2_DIGEST, 10, 11
    return bytes(head)[:FIXED] + data


def test_pieces_stop_and_more_decoded():
    r = decode(digest_record([(0, b"PRI * HTTP/2.0"), (9000, b"\x00\x00\x00\x04\x00\x00\x00\x00\x00")], 9009,
                             more=1))
    assert r.digest.pieces == ((0, b"PRI * HTTP/2.0"), (9000, b"\x00\x00\x00\x04\x00\x00\x00\x00\x00"))
    assert r.digest.more and r.digest.stop == 0
    assert r.data == b"PRI * HTTP/2.0" and r.ret == 9009  # the leading bytes, for protocol detection
    r = decode(digest_record([(40, b"x")], 41, stop=abi.H2_STOP_STEPS))
    assert r.data == b"" and r.digest.stop == abi.H2_STOP_STEPS


def test_a_digest_may_be_larger_than_a_plain_copy():
    big = b"h" * (abi.H2_DIGEST_CAP - abi.H2_DIGEST_HEAD - abi.H2_PIECE_HEAD)
    assert decode(digest_record([(0, big)], len(big))).digest.pieces == ((0, big),)
    with pytest.raises(DecodeError):
        decode(digest_record([(0, big + b"!")], len(big) + 1))


@pytest.mark.parametrize("pieces,ret", [([(0, b"abc")], 2),                  # past the transfer
                                        ([(5, b"abc"), (6, b"d")], 10),      # overlapping
                                        ([(3, b"")], 10)])                   # empty
def test_pieces_that_do_not_fit_are_decode_errors(pieces, ret):
    with pytest.raises(DecodeError):
        decode(digest_record(pieces, ret))


def test_cut_piece_head_is_a_decode_error():
    rec = digest_record([(0, b"abc")], 3)
    cut = bytearray(rec[:-4])
    cut[abi.SockIoEvent.data_len.offset] = len(cut) - FIXED
    with pytest.raises(DecodeError):
        decode(bytes(cut))
