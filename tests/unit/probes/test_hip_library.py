"""The probes' two claims about Debian's real libamdhip64 (HIP 5.2), read from its code:
no probed entry is single-stepped (each starts with a push, which x86 uprobes emulate), and
one call makes one record: no probed entry calls another probed entry, so bpf/hip_probes.c
needs no caller rule such as the runtime/driver one of bpf/cuda_probes.c. The probed entries
libamdhip64 calls itself (through its PLT) are called from API functions that are not probed
(hipMemcpyPeer calls hipMemcpy, hipLaunchByPtr calls hipModuleLaunchKernel, ...), or from code
no exported symbol covers (one call of hipLaunchCooperativeKernel): there the inner call is
the one record."""
from __future__ import annotations

import bisect
import glob
import re
import shutil
import subprocess

import pytest

from otel_gpu.cuda_calls import CALLS, HIP
from otel_gpu.probes.rows import rows_for
from otel_gpu.probes.prologue import emulated, entry_code

LIBS = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libamdhip64.so.[0-9]"))
pytestmark = pytest.mark.skipif(not LIBS or not shutil.which("objdump"),
                                reason="no libamdhip64 or objdump here (make setup installs libamdhip64-5)")
# Call records come from the rows of CALLS; the graph ops are read, never counted.
RECORDED = {s for c in CALLS if c.library == HIP for s in c.symbols}
# A direct call or jump to a symbol's first byte: through the PLT, or to the versioned symbol.
CALL = re.compile(r"^\s*([0-9a-f]+):\s.*\b(?:call|jmp)\s+[0-9a-f]+ <([^@>+]+)(?:@plt|@@[^>+]+)>$")


@pytest.mark.parametrize("lib", LIBS)
def test_no_hip_probe_is_single_stepped(lib):
    codes = {r.symbol: entry_code(lib, r.symbol) for r in rows_for(HIP)}
    codes = {s: c for s, c in codes.items() if c}  # symbols this release lacks (_spt forms)
    assert {"hipLaunchKernel", "hipModuleLaunchKernel", "hipMemcpy", "__hipRegisterFunction"} <= codes.keys()
    assert [s for s, c in codes.items() if not emulated(c)] == []


def _functions(lib: str) -> tuple[list[int], list[tuple[int, int, str]]]:
    """The exported functions' (start, size, name), sorted, and their starts."""
    out = subprocess.run(["nm", "-D", "-S", "--defined-only", lib], capture_output=True, text=True, check=True).stdout
    funcs = sorted((int(p[0], 16), int(p[1], 16), p[3].split("@")[0])
                   for p in (line.split() for line in out.splitlines()) if len(p) == 4 and p[2] in "Tt")
    return [f[0] for f in funcs], funcs


@pytest.mark.parametrize("lib", LIBS)
def test_no_probed_hip_entry_calls_another(lib):
    starts, funcs = _functions(lib)
    code = subprocess.run(["objdump", "-d", "--no-show-raw-insn", lib], capture_output=True, text=True,
                          check=True).stdout
    callers: dict[str, set] = {}
    for line in code.splitlines():
        m = CALL.match(line)
        if not m or m.group(2) not in RECORDED:
            continue
        at = int(m.group(1), 16)
        i = bisect.bisect_right(starts, at) - 1
        # The exported function whose extent holds the call; None: code of no exported function.
        owner = funcs[i][2] if i >= 0 and at < funcs[i][0] + funcs[i][1] else None
        if owner != m.group(2):  # a jump inside the function itself
            callers.setdefault(m.group(2), set()).add(owner)
    owners = {o for found in callers.values() for o in found}
    assert not owners & RECORDED, callers
    # What this release does: the self-calls the docstring names (a new one is read here first).
    assert {"hipMemcpy", "hipMemcpyAsync", "hipModuleLaunchKernel"} <= callers.keys(), callers
    assert {"hipMemcpyPeer", "hipLaunchByPtr"} <= owners, callers
