"""Where a Go executable's runtime functions are, stripped or not: from `.gopclntab`,
the table the Go runtime itself walks for tracebacks, which `strip` and
`-ldflags=-s -w` keep (Go 1.18+: pcHeader magic 0xfffffff0 or 0xfffffff1).

pcHeader: magic u32, pad u8 u8, minLC u8, ptrSize u8, then words: nfunc, nfiles,
textStart, funcnameOffset, cuOffset, filetabOffset, pctabOffset, pclnOffset. The function
table at pclnOffset is nfunc pairs (entryOff u32, funcOff u32); each _func begins with
entryOff u32 and nameOff i32 (into the name table). A function's address is textStart +
entryOff. Go 1.26 stopped storing textStart (0 in the header): it is then
moduledata.text, the word at TEXT_IN_MODULEDATA of the moduledata whose first word
points at the pcHeader (found in the data sections; the runtime's firstmoduledata)."""
from __future__ import annotations

import struct
from typing import Iterable, Optional

from .elf_file import ElfFile

MAGICS = (0xFFFFFFF0, 0xFFFFFFF1)  # Go 1.18-1.19, 1.20+
TEXT_IN_MODULEDATA = 176  # pcHeader, 6 slices (funcnametab .. ftab), findfunctab, minpc, maxpc, text
DATA_SECTIONS = (".go.module", ".noptrdata", ".data", ".data.rel.ro")  # .go.module: Go 1.26+
MAX_TABLE = 256 << 20  # bytes of .gopclntab read


def addresses(elf: ElfFile, names: Iterable[str]) -> dict[str, int]:
    """name -> entry address of each function of `names` the binary has; {} when it has
    no Go 1.18+ function table."""
    table = elf.sections.get(".gopclntab")
    if table is None or not table.size:
        return {}
    data = elf.read(table.offset, min(table.size, MAX_TABLE))
    if len(data) < 72 or struct.unpack_from("<I", data)[0] not in MAGICS or data[7] != 8:
        return {}
    nfunc, _, text, names_off, _, _, _, pcln_off = struct.unpack_from("<QQQQQQQQ", data, 8)
    if not text:
        text = _moduledata_text(elf, table.addr, table.addr + names_off)
        if text is None:
            return {}
    wanted = {n.encode(): n for n in names}
    out: dict[str, int] = {}
    for i in range(min(nfunc, (len(data) - pcln_off) // 8)):
        entry_off, func_off = struct.unpack_from("<II", data, pcln_off + 8 * i)
        at = pcln_off + func_off
        if at + 8 > len(data):
            break
        name_off = struct.unpack_from("<i", data, at + 4)[0]
        start = names_off + name_off
        end = data.find(b"\0", start, start + 256)
        name = wanted.get(data[start:end]) if end > 0 else None
        if name is not None:
            out[name] = text + entry_off
            if len(out) == len(wanted):
                break
    return out


def _moduledata_text(elf: ElfFile, header: int, funcnametab: int) -> Optional[int]:
    """moduledata.text: the moduledata is where a data word holds the pcHeader's
    address and the next holds the function name table's."""
    key = struct.pack("<QQ", header, funcnametab)
    for name in DATA_SECTIONS:
        s = elf.sections.get(name)
        if s is None or not s.size:
            continue
        data = elf.read(s.offset, min(s.size, MAX_TABLE))
        at = data.find(key)
        while at >= 0 and at % 8:
            at = data.find(key, at + 1)
        if at >= 0 and at + TEXT_IN_MODULEDATA + 8 <= len(data):
            return struct.unpack_from("<Q", data, at + TEXT_IN_MODULEDATA)[0]
    return None
