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
        self._records: Optional[list] = None

    @classmethod
    def running(cls) -> "Btf":
        with open(VMLINUX, "rb") as f:
            return cls(f.read())

    def _name(self, off: int) -> str:
        end = self.strings.find(b"\0", off)
        return self.strings[off:end].decode(errors="replace")

    def _all(self) -> list:
        """Every type's (name offset, info, size or type, byte offset of the record), by
        type id (id 0 is void): one pass, no member decoded."""
        if self._records is None:
            out, at, types, unpack = [None], 0, self.types, struct.unpack_from
            while at + 12 <= len(types):
                name_off, info, ref = unpack("<III", types, at)
                out.append((name_off, info, ref, at))
                kind = (info >> 24) & 0x1F
                at += 12 + _FIXED.get(kind, 0) + _PER_ENTRY.get(kind, 0) * (info & 0xFFFF)
            self._records = out
        return self._records

    def _struct(self, name: str) -> int:
        want = name.encode() + b"\0"
        for type_id, rec in enumerate(self._all()):
            if rec and (rec[1] >> 24) & 0x1F in (KIND_STRUCT, KIND_UNION) and \
                    self.strings[rec[0]:rec[0] + len(want)] == want:
                return type_id
        raise KeyError(f"no struct {name} in the kernel's BTF")

    def _members(self, type_id: int) -> list:
        """[(name, type id, bit offset)] of a struct or union."""
        _, info, _, at = self._all()[type_id]
        kflag, out = info >> 31, []
        for i in range(info & 0xFFFF):
            m_name, m_type, m_off = struct.unpack_from("<III", self.types, at + 12 + 12 * i)
            out.append((self._name(m_name), m_type, m_off & 0xFFFFFF if kflag else m_off))
        return out

    def _resolve(self, type_id: int) -> int:
        """Through typedefs and qualifiers to the type itself."""
        records = self._all()
        for _ in range(16):
            rec = records[type_id] if 0 < type_id < len(records) else None
            if rec is None or (rec[1] >> 24) & 0x1F not in _ALIASES:
                return type_id
            type_id = rec[2]
        return type_id

    def _is_struct(self, type_id: int) -> bool:
        records = self._all()
        return 0 < type_id < len(records) and (records[type_id][1] >> 24) & 0x1F in (KIND_STRUCT, KIND_UNION)

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


@functools.lru_cache(maxsize=1)
def task_fsbase_offset() -> Optional[int]:
    """offsetof(struct task_struct, thread.fsbase) in the running kernel (x86-64), or
    None where the kernel has no BTF (the goroutine probes are then off)."""
    try:
        return Btf.running().offset("task_struct", "thread", "fsbase")
    except (OSError, ValueError, KeyError, struct.error):
        return None
