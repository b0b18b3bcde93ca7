"""Where an entry uprobe goes: past a leading endbr64 when a push follows (the emulated
fast path), on the entry otherwise (probes/prologue.py)."""
import pytest

from otel_gpu.probes.prologue import entry_skip

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
