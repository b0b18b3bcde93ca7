"""compiler_memory: which mappings may be dropped, and that dropping them really
shrinks RSS while the bytes stay readable (a real read-only file mapping)."""
import mmap
import os

from otel_gpu.probes import compiler_memory as cm

SAMPLE = """\
7f0000000000-7f0000100000 r-xp 00000000 08:01 12 /usr/lib/libLLVM-14.so.1
Rss:                 400 kB
Anonymous:             0 kB
7f0000100000-7f0000200000 r--p 00100000 08:01 12 /usr/lib/libLLVM-14.so.1
Rss:                 100 kB
Anonymous:            96 kB
7f0000200000-7f0000300000 rw-p 00200000 08:01 12 /usr/lib/libLLVM-14.so.1
Rss:                  50 kB
Anonymous:             0 kB
garbage-line r-xp 0 0 0 /usr/lib/libclang-cpp.so.14
Rss:                  10 kB
7f0000400000-7f0000500000 r-xp 00000000 08:01 13 /usr/lib/libc.so.6
Rss:                 300 kB
Anonymous:             0 kB
"""


def test_parse_skips_malformed_blocks():
    maps = cm.parse_smaps(SAMPLE)
    assert [(m.perms, m.path.rsplit("/", 1)[-1], m.rss_kb, m.anonymous_kb) for m in maps] == [
        ("r-xp", "libLLVM-14.so.1", 400, 0), ("r--p", "libLLVM-14.so.1", 100, 96),
        ("rw-p", "libLLVM-14.so.1", 50, 0), ("r-xp", "libc.so.6", 300, 0)]


def test_only_clean_read_only_compiler_mappings_are_droppable():
    # Relocated (copy-on-write) pages, writable mappings and other libraries stay.
    assert [(m.start, m.perms) for m in cm.droppable(cm.parse_smaps(SAMPLE))] == [(0x7F0000000000, "r-xp")]


def _rss_kb(path: str) -> int:
    return sum(m.rss_kb for m in cm.parse_smaps(open("/proc/self/smaps").read()) if m.path == path)


def test_release_drops_resident_pages_and_keeps_the_bytes(tmp_path):
    path = str(tmp_path / "libLLVMtest.so")
    data = os.urandom(4 << 20)
    with open(path, "wb") as f:
        f.write(data)
    with open(path, "rb") as f:
        m = mmap.mmap(f.fileno(), len(data), flags=mmap.MAP_PRIVATE, prot=mmap.PROT_READ)
    try:
        assert m[:] == data  # every page resident
        assert _rss_kb(path) >= 4000
        dropped = cm.release(names=("libLLVMtest",))
        assert dropped >= 4000
        assert _rss_kb(path) < 100
        assert m[:] == data  # faulted back in from the file, unchanged
    finally:
        m.close()
