"""The compiled BPF program, kept on disk so that a start skips the clang compile.

bcc compiles the C with clang/LLVM at every start (~3.5 s on the 2-core VM, most of
`ready`; an empty program takes 0.25 s, so it is our program's cost). What the kernel
needs afterwards is small: per function its instructions and the license, per map its
kind and sizes. An entry holds those, with each map reference (an ld_imm64 carrying
this process's map fd, BPF_PSEUDO_MAP_FD) stored as the map's index; probes/cached_bpf.py
creates the maps again and writes their new fds in. The kernel's verifier checks every
program at load as before, so a cached program is never trusted more than a compiled one.

An entry is keyed by everything that decides the instructions (the C text, the cflags,
the headers under bpf/, the kernel release and header tree, bcc's version and this
format's). Anything unexpected in an entry (truncated, corrupt, another key, a
reference we do not relocate) is a CacheError: the caller logs one line, counts it
and compiles. No bcc import here: the unit tier reads and writes entries without it."""
from __future__ import annotations

import base64
import hashlib
import json
import logging
import os
import struct
import tempfile
import time
from dataclasses import dataclass, replace
from pathlib import Path
from typing import Iterable, Optional

log = logging.getLogger(__name__)

FORMAT_VERSION = 1
MAGIC = b"otel-gpu bpf cache"
SUFFIX = ".bpfc"
# Entries kept, the least recently used go: one per program a host starts (with and
# without --pid/--exe; kernels; program versions), ~0.6 MB each. At 4, when table sizes and
# stream settings were -D flags too, the suite's dozen settings evicted one another and
# recompiled (15-20 s each) over and over.
KEEP = 16
STALE_TMP_S = 600  # a temporary file this old is no writer's any more

# struct bpf_insn: u8 code, u8 dst:4|src:4, s16 off, s32 imm.
INSN = struct.Struct("<BBhi")
LD_IMM64, CALL = 0x18, 0x85
PSEUDO_MAP_FD, PSEUDO_CALL = 1, 1  # the src_reg of a map fd load, of a bpf-to-bpf call


class CacheError(Exception):
    """An entry we cannot use: why, in one line."""


class Uncacheable(Exception):
    """A compiled program this format cannot hold faithfully (nothing is written)."""


@dataclass(frozen=True)
class MapSpec:
    """What recreates a map (the kernel's view: type, sizes, flags) and bcc's key/leaf
    descriptions, from which the tables' ctypes types are built as bcc does."""
    name: str
    type: int
    key_size: int
    value_size: int
    max_entries: int
    flags: int
    key_desc: str
    leaf_desc: str


@dataclass(frozen=True)
class FuncSpec:
    name: str
    insns: bytes                      # map fd immediates zeroed
    relocs: tuple                     # (instruction index, map index) per map reference


@dataclass(frozen=True)
class Entry:
    license: str
    kern_version: int
    maps: tuple                       # MapSpec, in map index order
    funcs: tuple                      # FuncSpec, in bcc's function order (autoload order)

    def sized(self, max_entries: dict) -> "Entry":
        """This program with the named maps made at other sizes (the instructions do
        not depend on them: bpf/maps.h)."""
        return replace(self, maps=tuple(replace(m, max_entries=max_entries.get(m.name, m.max_entries))
                                        for m in self.maps))

    def has_sizes(self, max_entries: dict) -> bool:
        """Its named maps are made at these sizes already."""
        return all(max_entries.get(m.name, m.max_entries) == m.max_entries for m in self.maps)


# Files of a kernel header tree that change whenever the tree is rebuilt or replaced by
# another package's (the version, the configuration): their size and mtime stand for the
# tree, which is too large to hash at each start.
KERNEL_TREE_MARKS = ("Makefile", "include/generated/uapi/linux/version.h", "include/generated/autoconf.h",
                     "include/config/auto.conf")


def cache_key(text: bytes, cflags: Iterable[str], header_dir: Path, kernel: str, bcc_version: str,
              kernel_headers: Path) -> str:
    """sha256 of what decides the instructions. The headers under `header_dir` are
    #included by the text (events.h through maps.h), so their bytes count too; the
    kernel's own headers (`kernel_headers`, the tree bcc compiles against) by their
    path, the release, and the size and mtime of the files that change with the tree."""
    h = hashlib.sha256()

    def part(b: bytes) -> None:
        h.update(len(b).to_bytes(8, "little") + b)  # length-prefixed: no ambiguous joins

    part(f"format {FORMAT_VERSION}".encode())
    part(text)
    for flag in cflags:
        part(flag.encode())
    for path in sorted(header_dir.glob("*.h")):
        part(path.name.encode())
        part(path.read_bytes())
    part(kernel.encode())
    part(str(kernel_headers).encode())
    for mark in KERNEL_TREE_MARKS:
        try:
            st = os.stat(kernel_headers / mark)
            part(f"{mark} {st.st_size} {st.st_mtime_ns}".encode())
        except OSError:
            part(f"{mark} -".encode())
    part(bcc_version.encode())
    return h.hexdigest()


# --- relocation ------------------------------------------------------------------------
def _insns(code: bytes):
    if len(code) % INSN.size:
        raise CacheError(f"{len(code)} bytes of instructions is not a multiple of {INSN.size}")
    return [list(INSN.unpack_from(code, i)) for i in range(0, len(code), INSN.size)]


def relocate_out(code: bytes, fd_to_index: dict) -> tuple[bytes, tuple]:
    """Compiled instructions -> (instructions with map fds zeroed, relocations).
    Raises Uncacheable for a reference kind we would not write back correctly."""
    insns, relocs, i = _insns(code), [], 0
    while i < len(insns):
        op, regs, _off, imm = insns[i]
        src = regs >> 4
        if op == LD_IMM64:
            if src == PSEUDO_MAP_FD:
                if imm not in fd_to_index:
                    raise Uncacheable(f"instruction {i} loads fd {imm}, not one of the program's maps")
                relocs.append((i, fd_to_index[imm]))
                insns[i][3] = 0
            elif src != 0:
                raise Uncacheable(f"instruction {i} is an ld_imm64 of pseudo kind {src} (only map fds are relocated)")
            i += 2  # the second half of a 16-byte load
            continue
        if op == CALL and src not in (0, PSEUDO_CALL):
            raise Uncacheable(f"instruction {i} calls with pseudo kind {src} (kfunc: needs BTF)")
        i += 1
    return b"".join(INSN.pack(*x) for x in insns), tuple(relocs)


def relocate_in(func: FuncSpec, fds: list) -> bytes:
    """The stored instructions with this process's map fds written in."""
    insns = _insns(func.insns)
    for i, m in func.relocs:
        if not (0 <= i < len(insns) - 1 and 0 <= m < len(fds)):
            raise CacheError(f"{func.name}: relocation ({i}, {m}) out of range")
        op, regs, _off, imm = insns[i]
        if op != LD_IMM64 or regs >> 4 != PSEUDO_MAP_FD or imm != 0:
            raise CacheError(f"{func.name}: relocation at instruction {i} is not a zeroed map fd load")
        insns[i][3] = fds[m]
    return b"".join(INSN.pack(*x) for x in insns)


# --- file format -----------------------------------------------------------------------
# MAGIC FORMAT_VERSION key sha256(body) \n body; body: JSON (instructions base64).
def encode(entry: Entry, key: str) -> bytes:
    body = json.dumps({
        "license": entry.license, "kern_version": entry.kern_version,
        "maps": [vars(m) for m in entry.maps],
        "funcs": [{"name": f.name, "insns": base64.b64encode(f.insns).decode(), "relocs": [list(r) for r in f.relocs]}
                  for f in entry.funcs],
    }, separators=(",", ":")).encode()
    head = b"%s %d %s %s\n" % (MAGIC, FORMAT_VERSION, key.encode(), hashlib.sha256(body).hexdigest().encode())
    return head + body


def decode(data: bytes, key: str) -> Entry:
    head, sep, body = data.partition(b"\n")
    parts = head.split(b" ")
    if not sep or len(parts) != 6 or b" ".join(parts[:3]) != MAGIC:
        raise CacheError("not a cache entry (no header)")
    if parts[3] != str(FORMAT_VERSION).encode():
        raise CacheError(f"format {parts[3].decode(errors='replace')}, not {FORMAT_VERSION}")
    if parts[4] != key.encode():
        raise CacheError("entry is for another key")
    if hashlib.sha256(body).hexdigest().encode() != parts[5]:
        raise CacheError("checksum mismatch (truncated or corrupt)")
    try:
        doc = json.loads(body)
        maps = tuple(MapSpec(**{f: _typed(m[f], MapSpec.__annotations__[f]) for f in MapSpec.__annotations__})
                     for m in doc["maps"])
        funcs = tuple(FuncSpec(_typed(f["name"], "str"), base64.b64decode(_typed(f["insns"], "str"), validate=True),
                               tuple((_typed(i, "int"), _typed(m, "int")) for i, m in f["relocs"]))
                      for f in doc["funcs"])
        entry = Entry(_typed(doc["license"], "str"), _typed(doc["kern_version"], "int"), maps, funcs)
    except (ValueError, KeyError, TypeError, AttributeError) as e:
        raise CacheError(f"malformed body ({type(e).__name__}: {e})") from None
    if not entry.funcs or len({f.name for f in entry.funcs}) != len(entry.funcs):
        raise CacheError("no functions, or a name twice")
    if len({m.name for m in entry.maps}) != len(entry.maps):
        raise CacheError("a map name twice")
    return entry


def _typed(value, annotation: str):
    kind = {"str": str, "int": int}[annotation]
    if not isinstance(value, kind) or isinstance(value, bool):
        raise TypeError(f"{value!r} is not {annotation}")
    return value


# --- the directory ---------------------------------------------------------------------
class CacheDir:
    """Entries as <key>.bpfc, 0600 in a 0700 directory owned by root (the instructions
    run in the kernel: nobody else may write them). Written whole or not at all."""

    def __init__(self, path: str, keep: int = KEEP) -> None:
        self.path = Path(path)
        self.keep = keep

    def entry_path(self, key: str) -> Path:
        return self.path / f"{key}{SUFFIX}"

    def read(self, key: str) -> Optional[Entry]:
        """None when there is no entry; CacheError when there is one we cannot use."""
        path = self.entry_path(key)
        try:
            st = self.path.stat()
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CacheError(f"{self.path}: {e.strerror}") from None
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise CacheError(f"{self.path} is writable by others or not ours (mode {st.st_mode & 0o777:o})")
        try:
            fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
        except FileNotFoundError:
            return None
        except OSError as e:
            raise CacheError(f"{path.name}: {e.strerror}") from None
        with os.fdopen(fd, "rb") as f:
            st = os.fstat(f.fileno())
            if st.st_uid != os.geteuid() or st.st_mode & 0o022:
                raise CacheError(f"{path.name} is writable by others or not ours")
            entry = decode(f.read(), key)
            try:
                os.utime(f.fileno())  # used now: prune() keeps the most recently used
            except OSError:
                pass  # a read-only cache still serves
            return entry

    def write(self, key: str, entry: Entry) -> Path:
        """Atomically (a temporary file renamed over the name); prunes to `keep` entries."""
        self.path.mkdir(mode=0o700, parents=True, exist_ok=True)
        os.chmod(self.path, 0o700)
        fd, tmp = tempfile.mkstemp(prefix=".tmp-", suffix=SUFFIX, dir=self.path)  # 0600
        try:
            with os.fdopen(fd, "wb") as f:
                f.write(encode(entry, key))
                f.flush()
                os.fsync(f.fileno())
            os.replace(tmp, self.entry_path(key))
        except BaseException:
            try:
                os.unlink(tmp)
            except OSError:
                pass
            raise
        self.prune(keep_key=key)
        return self.entry_path(key)

    def prune(self, keep_key: str) -> None:
        """The `keep` most recently used (written or read) entries stay (`keep_key`'s always), and a
        temporary file left by a crash mid-write goes (a live writer's is younger)."""
        entries, doomed, now = [], [], time.time()
        for p in self.path.glob(f"*{SUFFIX}"):
            try:
                mtime = p.stat().st_mtime
            except OSError:
                continue
            if p.name.startswith(".tmp-"):
                doomed += [p] if now - mtime > STALE_TMP_S else []
            elif p.name != f"{keep_key}{SUFFIX}":
                entries.append((mtime, p))
        doomed += [p for _, p in sorted(entries, reverse=True)[max(self.keep - 1, 0):]]
        for p in doomed:
            try:
                p.unlink()
            except OSError as e:
                log.debug("could not prune %s: %s", p, e)
