"""The BPF program cache's file format, key and directory (probes/program_cache.py):
what is written reads back equal; anything else is a CacheError, never an entry."""
from __future__ import annotations

import os
import stat
import time

import pytest

from otel_gpu.probes.program_cache import (FORMAT_VERSION, INSN, KEEP, CacheDir, CacheError, Entry, FuncSpec,
                                           MapSpec, Uncacheable, cache_key, decode, encode, relocate_in,
                                           relocate_out)

KEY, OTHER = "a" * 64, "b" * 64


def insn(op, dst=0, src=0, off=0, imm=0) -> bytes:
    return INSN.pack(op, dst | src << 4, off, imm)


def ld_map(fd: int, dst: int = 1) -> bytes:  # ld_imm64 r<dst>, map fd: two slots
    return insn(0x18, dst, 1, 0, fd) + insn(0, 0, 0, 0, 0)


def program(fds=(7, 9)) -> bytes:
    return (insn(0xb7, 1, 0, 0, 7)        # mov r1, 7: an immediate equal to an fd is no map reference
            + ld_map(fds[0]) + insn(0x85, 0, 0, 0, 1)   # bpf_map_lookup_elem
            + insn(0x18, 2, 0, 0, 9) + insn(0, 0, 0, 0, 0)   # plain 64-bit constant 9
            + ld_map(fds[1], 3) + insn(0x85, 0, 1, 0, 2)     # a bpf-to-bpf call (relative: kept)
            + insn(0x95))


MAPS = (MapSpec("traced", 1, 4, 4, 4096, 0, '"unsigned int"', '"unsigned int"'),
        MapSpec("events", 27, 0, 0, 1 << 23, 0, '"int"', '"int"'))


def entry() -> Entry:
    code, relocs = relocate_out(program(), {7: 0, 9: 1})
    return Entry("GPL", 0, MAPS, (FuncSpec("tracepoint__syscalls__sys_enter_read", code, relocs),
                                  FuncSpec("on_launch", code, relocs)))


def test_relocation_writes_each_map_fd_back_where_it_was():
    code, relocs = relocate_out(program(), {7: 0, 9: 1})
    assert relocs == ((1, 0), (6, 1))
    assert code == program(fds=(0, 0))  # only the map loads were zeroed
    func = FuncSpec("f", code, relocs)
    assert relocate_in(func, [31, 44]) == program(fds=(31, 44))
    assert relocate_in(func, [7, 9]) == program()


@pytest.mark.parametrize("code,why", [
    (insn(0x18, 1, 2, 0, 7) + insn(0, 0, 0, 0, 16), "pseudo kind 2"),    # map value (global data)
    (insn(0x18, 1, 4, 0, 3) + insn(0, 0, 0, 0, 0), "pseudo kind 4"),     # a function address
    (insn(0x85, 0, 2, 0, 1234), "kfunc"),
    (ld_map(8), "not one of the program's maps"),
])
def test_references_not_relocated_are_refused(code, why):
    with pytest.raises(Uncacheable, match=why):
        relocate_out(code + insn(0x95), {7: 0})


@pytest.mark.parametrize("relocs", [((0, 0),), ((1, 2),), ((7, 0),), ((-1, 0),)])
def test_a_relocation_that_does_not_point_at_a_zeroed_map_load_is_refused(relocs):
    code, _ = relocate_out(program(), {7: 0, 9: 1})
    with pytest.raises(CacheError):
        relocate_in(FuncSpec("f", code, relocs), [3, 4])


def test_encode_decode_round_trip():
    e = entry()
    assert decode(encode(e, KEY), KEY) == e


def _body_edit(data: bytes, old: bytes, new: bytes) -> bytes:
    """A forged entry: the body changed and its checksum recomputed to match."""
    import hashlib
    head, _, body = data.partition(b"\n")
    body = body.replace(old, new, 1)
    parts = head.split(b" ")
    parts[5] = hashlib.sha256(body).hexdigest().encode()
    return b" ".join(parts) + b"\n" + body


@pytest.mark.parametrize("damage,why", [
    (lambda d: d[:len(d) // 2], "checksum"),                         # truncated
    (lambda d: d[:-10] + bytes([d[-10] ^ 1]) + d[-9:], "checksum"),  # one bit flipped
    (lambda d: d.replace(KEY.encode(), OTHER.encode()), "another key"),
    (lambda d: d.replace(b" %d " % FORMAT_VERSION, b" 99 ", 1), "format 99"),
    (lambda d: b"", "no header"),
    (lambda d: b"\x7fELF" + d, "no header"),
    (lambda d: _body_edit(d, b'"kern_version":0', b'"kern_version":"0"'), "malformed"),
    (lambda d: _body_edit(d, b'"key_size":4', b'"key_size":true'), "malformed"),
    (lambda d: _body_edit(d, b'"insns":"', b'"insns":"!'), "malformed"),
    (lambda d: _body_edit(d, b'"funcs":[', b'"funcs":0,"x":['), "malformed"),
    (lambda d: _body_edit(d, b"on_launch", b"tracepoint__syscalls__sys_enter_read"), "a name twice"),
])
def test_damaged_entries_are_refused(damage, why):
    with pytest.raises(CacheError, match=why):
        decode(damage(encode(entry(), KEY)), KEY)


def test_key_covers_what_decides_the_instructions(tmp_path):
    (tmp_path / "events.h").write_text("struct e { int a; };")
    base = dict(text=b"int x;", cflags=["-DA=1"], header_dir=tmp_path, kernel="6.18", bcc_version="0.26.0",
                kernel_headers=tmp_path / "no-headers")
    k = cache_key(**base)
    assert k == cache_key(**base) and len(k) == 64
    for change in [dict(text=b"int y;"), dict(cflags=["-DA=2"]), dict(cflags=["-DA=1", ""]),
                   dict(kernel="6.19"), dict(bcc_version="0.27.0")]:
        assert cache_key(**{**base, **change}) != k, change
    (tmp_path / "events.h").write_text("struct e { long a; };")
    assert cache_key(**base) != k


def test_key_covers_the_kernel_header_tree(tmp_path):
    """Another package's headers at the same path (BCC_KERNEL_SOURCE's tree rebuilt by
    scripts/setup.sh, say) give another key: the marks' sizes and mtimes differ."""
    tree = tmp_path / "headers"
    (tree / "include/generated/uapi/linux").mkdir(parents=True)
    version = tree / "include/generated/uapi/linux/version.h"
    version.write_text("#define LINUX_VERSION_CODE 393472\n")
    base = dict(text=b"int x;", cflags=[], header_dir=tmp_path, kernel="6.18", bcc_version="0.26.0",
                kernel_headers=tree)
    k = cache_key(**base)
    assert cache_key(**base) == k
    assert cache_key(**{**base, "kernel_headers": tmp_path / "elsewhere"}) != k
    version.write_text("#define LINUX_VERSION_CODE 393473\n")
    assert cache_key(**base) != k
    t = cache_key(**base)
    (tree / "Makefile").write_text("VERSION = 6\n")
    assert cache_key(**base) != t


def test_written_root_only_atomically_and_read_back(tmp_path):
    d = CacheDir(str(tmp_path / "cache"))
    assert d.read(KEY) is None
    path = d.write(KEY, entry())
    assert stat.S_IMODE(os.stat(tmp_path / "cache").st_mode) == 0o700
    assert stat.S_IMODE(os.stat(path).st_mode) == 0o600
    assert [p.name for p in (tmp_path / "cache").iterdir()] == [path.name]  # no temporary file left
    assert d.read(KEY) == entry()
    assert d.read(OTHER) is None


def test_an_entry_under_another_keys_name_is_refused(tmp_path):
    d = CacheDir(str(tmp_path))
    os.rename(d.write(KEY, entry()), d.entry_path(OTHER))
    with pytest.raises(CacheError, match="another key"):
        d.read(OTHER)


def test_a_directory_or_entry_others_can_write_is_refused(tmp_path):
    d = CacheDir(str(tmp_path / "c"))
    path = d.write(KEY, entry())
    os.chmod(path, 0o666)
    with pytest.raises(CacheError, match="writable by others"):
        d.read(KEY)
    os.chmod(path, 0o600)
    os.chmod(tmp_path / "c", 0o777)
    with pytest.raises(CacheError, match="writable by others"):
        d.read(KEY)


def test_a_symlinked_entry_is_refused(tmp_path):
    d = CacheDir(str(tmp_path / "c"))
    path = d.write(KEY, entry())
    os.rename(path, tmp_path / "elsewhere")
    os.symlink(tmp_path / "elsewhere", path)
    with pytest.raises(CacheError):
        d.read(KEY)


def test_old_entries_and_stale_temporary_files_are_pruned(tmp_path):
    d = CacheDir(str(tmp_path))
    keys = [f"{i:064x}" for i in range(KEEP + 3)]
    for i, k in enumerate(keys):
        d.write(k, entry())
        os.utime(d.entry_path(k), (1000 + i, 1000 + i))  # written in this order
    stale, fresh = tmp_path / ".tmp-old.bpfc", tmp_path / ".tmp-live.bpfc"
    stale.write_bytes(b"x")
    fresh.write_bytes(b"x")
    os.utime(stale, (time.time() - 3600,) * 2)
    d.write(keys[0], entry())  # rewritten: the newest
    names = {p.name for p in tmp_path.iterdir()}
    assert names == {f"{k}.bpfc" for k in [keys[0]] + keys[-(KEEP - 1):]} | {fresh.name}


def test_an_entry_read_is_kept_over_ones_used_less_recently(tmp_path):
    d = CacheDir(str(tmp_path))
    keys = [f"{i:064x}" for i in range(KEEP + 1)]
    for i, k in enumerate(keys[:KEEP]):
        d.write(k, entry())
        os.utime(d.entry_path(k), (1000 + i, 1000 + i))  # written in this order, long ago
    assert d.read(keys[0]) is not None  # the oldest written, used now
    d.write(keys[KEEP], entry())  # one more than KEEP: the least recently used goes
    assert {p.name for p in tmp_path.iterdir()} == {f"{k}.bpfc" for k in keys if k != keys[1]}


def test_an_entry_sized_again_changes_only_the_named_maps():
    e = entry()
    names = [m.name for m in e.maps]
    sized = e.sized({names[0]: 12345, "no_such_map": 7})
    assert [m.max_entries for m in sized.maps] == [12345] + [m.max_entries for m in e.maps[1:]]
    assert sized.funcs == e.funcs and sized.maps[1:] == e.maps[1:]
    assert e.has_sizes({names[0]: e.maps[0].max_entries}) and not e.has_sizes({names[0]: 12345})
    assert sized.has_sizes({names[0]: 12345})
