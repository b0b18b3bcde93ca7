"""Member offsets of the running kernel's structs, from its BTF (/sys/kernel/btf/vmlinux).

bcc compiles against a header tree that may be another kernel's (Debian's 6.1 headers
on a 6.18 kernel here): a struct the program reads through bpf_probe_read_kernel must
have its offsets from the running kernel, passed in as -D flags. Only what a lookup
needs is parsed: the type section's records, to find named structs and their members."""
from __future__ import annotations

import functools
import struct
from typing import Optional

VMLINUX = "/sys/kernel/btf/vmlinux"
BTF_MAGIC = 0xEB9F
KIND_STRUCT, KIND_UNION = 4, 5
# Bytes after the 12-byte btf_type record, by kind: fixed, and per vlen entry.
_FIXED = {1: 4, 3: 12, 14: 4, 17: 4}           # INT, ARRAY, VAR, DECL_TAG
_PER_ENTRY = {4: 12, 5: 12, 6: 8, 13: 8, 15: 12, 19: 12}  # STRUCT, UNION, ENUM, FUNC_PROTO, DATASEC, ENUM64
_ALIASES = (8, 9, 10, 11, 18)  # TYPEDEF, VOLATILE, CONST, RESTRICT, TYPE_TAG


class Btf:
    def __init__(self, data: bytes) -> None:
        magic, _, _, hdr_len, type_off, type_len, str_off, str_len = struct.unpack_from("<HBBIIIII", data, 0)
        if magic != BTF_MAGIC:
            raise ValueError("not BTF")
        self.types = data[hdr_len + type_off: hdr_len + type_off + type_len]
        self.strings = data[hdr_len + str_off: hdr_len + str_off + str_len]
        self._records: list = [None]  # by type id, as far as walked (_record)
        self._at = 0                  # byte offset of the next record to walk

    @classmethod
    def running(cls) -> "Btf":
        with open(VMLINUX, "rb") as f:
            return cls(f.read())

    def _name(self, off: int) -> str:
        end = self.strings.find(b"\0", off)
        return self.strings[off:end].decode(errors="replace")

    def _record(self, type_id: int) -> Optional[tuple]:
        """Type `type_id`'s (name offset, info, size or type, byte offset of the record),
        or None past the last (id 0 is void). Records are walked only as far as asked:
        the structs a lookup needs come early (task_struct is id ~100 of ~130,000), and
        the whole walk took ~0.2 s of every start."""
        records, types = self._records, self.types
        while len(records) <= type_id and self._at + 12 <= len(types):
            name_off, info, ref = struct.unpack_from("<III", types, self._at)
            records.append((name_off, info, ref, self._at))
            kind = (info >> 24) & 0x1F
            self._at += 12 + _FIXED.get(kind, 0) + _PER_ENTRY.get(kind, 0) * (info & 0xFFFF)
        return records[type_id] if 0 < type_id < len(records) else None

    def _struct(self, name: str) -> int:
        want = name.encode() + b"\0"
        type_id = 1
        while (rec := self._record(type_id)) is not None:
            if (rec[1] >> 24) & 0x1F in (KIND_STRUCT, KIND_UNION) and \
                    self.strings[rec[0]:rec[0] + len(want)] == want:
                return type_id
            type_id += 1
        raise KeyError(f"no struct {name} in the kernel's BTF")

    def _members(self, type_id: int) -> list:
        """[(name, type id, bit offset)] of a struct or union."""
        _, info, _, at = self._record(type_id)
        kflag, out = info >> 31, []
        for i in range(info & 0xFFFF):
            m_name, m_type, m_off = struct.unpack_from("<III", self.types, at + 12 + 12 * i)
            out.append((self._name(m_name), m_type, m_off & 0xFFFFFF if kflag else m_off))
        return out

    def _resolve(self, type_id: int) -> int:
        """Through typedefs and qualifiers to the type itself."""
        for _ in range(16):
            rec = self._record(type_id)
            if rec is None or (rec[1] >> 24) & 0x1F not in _ALIASES:
                return type_id
            type_id = rec[2]
        return type_id

    def _is_struct(self, type_id: int) -> bool:
        rec = self._record(type_id)
        return rec is not None and (rec[1] >> 24) & 0x1F in (KIND_STRUCT, KIND_UNION)

    def offset(self, struct_name: str, *path: str) -> int:
        """Byte offset of struct_name.path[0].path[1]... (each a member of the one
        before, found in anonymous struct/union members too)."""
        type_id, bits = self._struct(struct_name), 0
        for name in path:
            hit = self._member(type_id, name)
            if hit is None:
                raise KeyError(f"no member {name} in struct {struct_name}")
            bits, type_id = bits + hit[0], hit[1]
        return bits // 8

    def _member(self, type_id: int, name: str):
        """(bit offset, the member's type id, resolved), looking into anonymous members."""
        for m_name, m_type, bits in self._members(type_id):
            m_type = self._resolve(m_type)
            if m_name == name:
                return bits, m_type
            if not m_name and self._is_struct(m_type):
                inner = self._member(m_type, name)
                if inner is not None:
                    return bits + inner[0], inner[1]
        return None


def _task_time(btf: Btf) -> tuple[int, int, int, int]:
    pid, tgid = btf.offset("task_struct", "pid"), btf.offset("task_struct", "tgid")
    try:
        state = btf.offset("task_struct", "__state")
    except KeyError:
        state = btf.offset("task_struct", "state")
    return pid, tgid, state, btf.offset("task_struct", "sched_info", "run_delay")


def _fd_table(btf: Btf) -> tuple[int, int, int, int, int, int]:
    return (btf.offset("task_struct", "files"), btf.offset("files_struct", "fdt"),
            btf.offset("fdtable", "max_fds"), btf.offset("fdtable", "fd"),
            btf.offset("file", "f_inode"), btf.offset("inode", "i_ino"))


_READS = {"task_time": _task_time, "fsbase": lambda btf: btf.offset("task_struct", "thread", "fsbase"),
          "fd_table": _fd_table}


@functools.lru_cache(maxsize=1)
def _from_btf() -> dict:
    """Every set of offsets the program takes from the kernel's BTF, by name, from one read
    and walk of it (one took ~33 ms of a start here, three ~52); a set the kernel lacks is absent, all
    of them without BTF. The blob is not kept."""
    try:
        btf = Btf.running()
    except (OSError, ValueError, struct.error):
        return {}
    out = {}
    for name, read in _READS.items():
        try:
            out[name] = read(btf)
        except (ValueError, KeyError, struct.error):
            pass
    return out


def task_time_offsets() -> Optional[tuple[int, int, int, int]]:
    """offsetof(struct task_struct, pid), of its tgid, of its state (`__state` since 5.14,
    `state` before) and of sched_info.run_delay (its runqueue wait, CONFIG_SCHED_INFO), for
    the time split (bpf/sched_probes.c, bpf/thread_times.c), or None without BTF or without
    that field (the time split is then off)."""
    return _from_btf().get("task_time")


def task_fsbase_offset() -> Optional[int]:
    """offsetof(struct task_struct, thread.fsbase) in the running kernel (x86-64), or
    None where the kernel has no BTF (the goroutine probes are then off)."""
    return _from_btf().get("fsbase")


def fd_table_offsets() -> Optional[tuple[int, int, int, int, int, int]]:
    """offsetof(struct task_struct, files), (files_struct, fdt), (fdtable, max_fds),
    (fdtable, fd), (file, f_inode) and (inode, i_ino): the syscall probes read the inode
    number of the file an fd holds, at accept's and close's exits (bpf/maps.h fd_ino), or
    None without BTF (a close then ends whatever connection its fd has in the table)."""
    return _from_btf().get("fd_table")
