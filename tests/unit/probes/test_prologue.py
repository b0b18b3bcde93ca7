"""Where an entry uprobe goes: past a leading endbr64 when a push follows (the emulated
fast path), on the entry otherwise (probes/prologue.py)."""
import glob
import os

import pytest

from otel_gpu.cuda_calls import RUNTIME
from otel_gpu.probes.rows import rows_for
from otel_gpu.probes.prologue import calls, emulated, entry_code, entry_skip, skip, tail_call

ENDBR64 = "f30f1efa"


@pytest.mark.parametrize("code,skip", [
    (ENDBR64 + "55" + "4889e5", 4),        # endbr64; push %rbp; mov %rsp,%rbp (CET builds)
    (ENDBR64 + "4157" + "4156", 4),        # endbr64; push %r15; push %r14
    (ENDBR64 + "4889e5" + "55", 0),        # endbr64; mov: would be single-stepped there too
    (ENDBR64 + "8d4701", 0),               # endbr64; lea (a leaf): stays on the entry
    ("55" + "4889e5" + "4157", 0),         # push %rbp first: already emulated (libcudart 12, 13)
    ("31c0c3" + "000000", 0),              # xor %eax,%eax; ret
    (ENDBR64, 0),                          # the file ends: nothing after it to tell
])
def test_the_skip_follows_the_first_instructions(tmp_path, code, skip):
    f = tmp_path / "lib.so"
    f.write_bytes(b"\x90" * 16 + bytes.fromhex(code))
    assert entry_skip(str(f), 16) == skip


def test_an_unreadable_file_leaves_the_probe_on_the_entry(tmp_path):
    assert entry_skip(str(tmp_path / "gone.so"), 0) == 0


@pytest.mark.parametrize("code,emulated_there", [
    ("55" + "4889e5", True),             # push %rbp (libcudart's entries)
    ("4155" + "4154", True),             # push %r13
    (ENDBR64 + "4157", True),            # probed past the endbr64, on the push
    (ENDBR64 + "4883ec18", False),       # endbr64; sub: single-stepped there
    ("4883ec18" + "64488b", False),      # sub $0x18,%rsp (Debian's SSL_read)
    ("493b6610", False),                 # cmp 0x10(%r14),%rsp (a Go function's stack check)
    ("e8" + "00000000", True),           # call rel32
    ("", True),                          # not read: nothing claimed
])
def test_which_entries_x86_emulates(code, emulated_there):
    assert emulated(bytes.fromhex(code)) is emulated_there


def test_a_tail_call_is_found_only_after_a_bare_stack_adjustment():
    # sub $0x8,%rsp; call +0x100 (from the call's end, at 9): the callee at 9 + 0x100
    assert tail_call(bytes.fromhex("4883ec08" + "e800010000" + "31d2")) == 9 + 0x100
    assert tail_call(bytes.fromhex(ENDBR64 + "4883ec08" + "e8f0ffffff")) == 13 - 16
    assert tail_call(bytes.fromhex("4883ec08" + "4889fb" + "e800010000")) is None  # a mov first: not proven
    assert tail_call(bytes.fromhex("55" + "e800010000")) is None
    code = bytes.fromhex("4883ec18" + "64488b042528000000" + "e800010000")
    assert calls(code, 13 + 5 + 0x100) and not calls(code, 13 + 0x100)


GO_CHECK = "493b6610"  # cmp 0x10(%r14),%rsp: Go's stack check


@pytest.mark.parametrize("code,at", [
    (GO_CHECK + "0f86a6000000" + "55" + "4889e5", 10),  # runtime.runqput (Go 1.27): probed on the push
    (GO_CHECK + "76" + "40" + "55", 6),                  # jbe rel8
    ("4c8d6424b8" + "4d3b6610" + "0f8695010000" + "55", 15),  # lea -0x48(%rsp),%r12 first (a big frame)
    ("4c8da42400ffffff" + "4d3b6610" + "0f8695010000" + "4155", 18),
    (GO_CHECK + "0f86a6000000" + "4883ec10", 0),        # no push after it: stays on the entry
    ("4c8d6424b8" + "493b6610" + "0f8695010000" + "55", 0),  # the lea's r12 not the one compared: no
    (GO_CHECK + "7740" + "55", 0),                       # ja, not the stack check's jbe
])
def test_a_go_stack_check_is_stepped_over_to_the_push(code, at):
    assert skip(bytes.fromhex(code)) == at
    assert emulated(bytes.fromhex(code)) is bool(at)


def _cudarts() -> list:
    from otel_gpu.demo.cuda_work import find_cudart
    found = [p for p in glob.glob("/usr/local/cuda*/lib*/libcudart.so.1[0-9]") if os.path.isfile(p)]
    try:
        found.append(find_cudart())
    except Exception:  # no PyPI wheel here
        pass
    return sorted({os.path.realpath(p) for p in found})  # each file once (cuda -> cuda-13.0, lib -> lib64)


@pytest.mark.skipif(not _cudarts(), reason="no real libcudart here (make setup installs the PyPI wheel)")
@pytest.mark.parametrize("lib", _cudarts() or ["none"])
def test_no_runtime_probe_is_single_stepped_on_the_real_libcudart(lib):
    """libcudart 12 and 13 start every probed entry with a push (emulated)."""
    codes = {r.symbol: entry_code(lib, r.symbol) for r in rows_for(RUNTIME)}
    codes = {s: c for s, c in codes.items() if c}  # a symbol this release lacks (_ptsz forms)
    assert "cudaLaunchKernel" in codes
    assert [s for s, c in codes.items() if not emulated(c)] == []
