"""A function that starts with endbr64 (a CET build) is probed on the push after it
(probes/prologue.py), through both backends: the probe fires there (the instruction
pointer it sees), once per call, and reads the same argument as on the entry. Placed there, its cost on this VM fell from ~10.3 us to
~0.85 us per call (the entry is single-stepped, the push emulated): a benchmark figure,
not asserted here."""
from __future__ import annotations

import ctypes as ct
import subprocess

import pytest
from bcc import BPF

from otel_gpu.probes import uprobe_multi
from otel_gpu.probes.prologue import entry_skip
from otel_gpu.probes.source import kernel_headers_hint
from otel_gpu.probes.uprobe_links import MultiLinks, PerfUprobes
from tests.harness import TARGETS

CALLS = 1000
PROGRAM = b"""
#include <uapi/linux/ptrace.h>
BPF_ARRAY(seen, u64, 3);  /* [0] hits, [1] the sum of the first argument, [2] where it hit */
int on_probed(struct pt_regs *ctx) {
    u32 hits = 0, sum = 1, where = 2;
    u64 ip = PT_REGS_IP(ctx);
    seen.atomic_increment(hits);
    u64 *s = seen.lookup(&sum);
    if (s)
        __sync_fetch_and_add(s, PT_REGS_PARM1(ctx));
    seen.update(&where, &ip);
    return 0;
}
"""


@pytest.fixture(scope="module")
def library(tmp_path_factory):
    out = tmp_path_factory.mktemp("cet") / "libcet.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O2", "-fno-omit-frame-pointer", "-fcf-protection=full",
                    "-o", str(out), str(TARGETS / "cet_library.c")], check=True)
    return str(out)


@pytest.mark.parametrize("backend", [PerfUprobes, MultiLinks])
def test_a_cet_function_is_probed_after_its_endbr64_once_per_call(library, backend):
    if backend is MultiLinks and not uprobe_multi.supported()[0]:
        pytest.skip(f"no uprobe_multi links on this kernel: {uprobe_multi.supported()[1]}")
    _, offset = BPF._check_path_symbol(library.encode(), b"probed", None, -1)
    assert entry_skip(library, offset) == 4  # the build has the pattern: endbr64, then a push
    kernel_headers_hint()
    b = BPF(text=PROGRAM)
    try:
        events = backend(b).attach(library, "on_probed", symbol="probed")
        if backend is PerfUprobes:  # bcc names the event after the file offset it probes
            assert any(f"{offset + 4:x}" in (e.decode() if isinstance(e, bytes) else str(e)) for e in events), events
        lib = ct.CDLL(library)
        lib.probed.argtypes, lib.probed.restype = [ct.c_long], ct.c_long
        assert [lib.probed(i) for i in range(CALLS)] == [i + 1 for i in range(CALLS)]
        seen = b["seen"]
        assert (seen[0].value, seen[1].value) == (CALLS, sum(range(CALLS)))
        # The instruction it hit, from the function's address: 4 past the entry (the kernel
        # reports the breakpoint's address, or the byte after its int3).
        assert seen[2].value - ct.cast(lib.probed, ct.c_void_p).value in (4, 5)
    finally:
        b.cleanup()
