"""The runtime code ranges the driver launch probes compare their caller with
(probes/runtime_text.py), from /proc/<pid>/maps text and from discovery's scan of a
fake /proc tree (the groups tests' Tree)."""
import os

from otel_gpu.probes.discovery import Discovery
from otel_gpu.probes.runtime_text import runtime_ranges
from tests.unit.pipeline.test_groups import Tree

CUDART = "/opt/venv/nvidia/cuda_runtime/lib/libcudart.so.12"
LIBCUDA = "/usr/lib/x86_64-linux-gnu/libcuda.so.1"
MAPS = f"""\
7f0000000000-7f0000010000 r--p 00000000 08:01 12 {CUDART}
7f0000010000-7f0000090000 r-xp 00010000 08:01 12 {CUDART}
7f0000090000-7f00000a0000 rw-p 00090000 08:01 12 {CUDART}
7f1000000000-7f1000400000 r-xp 00000000 08:01 13 {LIBCUDA}
7f2000000000-7f2000100000 r-xp 00000000 08:01 14 /usr/lib/libcublas.so.12
7f3000000000-7f3000008000 r-xp 00000000 08:01 15 /tmp/libcudart.so.13 (deleted)
7ffd00000000-7ffd00021000 rw-p 00000000 00:00 0 [stack]
"""


def test_only_executable_mappings_of_the_runtime_files():
    assert runtime_ranges(MAPS, {CUDART}) == [(0x7f0000010000, 0x7f0000090000)]
    assert runtime_ranges(MAPS, {CUDART, "/tmp/libcudart.so.13"}) == [
        (0x7f0000010000, 0x7f0000090000), (0x7f3000000000, 0x7f3000008000)]  # a replaced file still runs
    assert runtime_ranges(MAPS, set()) == []  # libcuda, cuBLAS: never the runtime
    assert runtime_ranges("garbage line\nzz-yy r-xp 0 0:0 1 " + CUDART + "\n", {CUDART}) == []


def _file(tree: Tree, pid: int, path: str) -> None:
    f = tree.root / str(pid) / "root" / path.lstrip("/")
    f.parent.mkdir(parents=True, exist_ok=True)
    f.write_text("")


def test_scan_gives_each_cuda_process_its_runtime_ranges(tmp_path):
    tree = Tree(tmp_path)
    tree.add(1, 0)
    both = tree.add(100, 1, maps=MAPS)
    driver_only = tree.add(200, 1, maps="\n".join(line for line in MAPS.splitlines() if LIBCUDA in line))
    app = str(tmp_path / "app")  # the executable, with cudart linked in
    open(app, "w").close()
    static = tree.add(300, 1, maps=f"400000-500000 r-xp 0 08:01 20 {app}\n{MAPS.splitlines()[3]}\n")
    for pid in (both, driver_only, static):
        for path in (CUDART, LIBCUDA, "/tmp/libcudart.so.13", app):
            _file(tree, pid, path)
    os.remove(tree.root / str(static) / "exe")
    os.symlink(app, tree.root / str(static) / "exe")
    found = Discovery(tree.path, has_static_cudart=lambda p: p.endswith(app)).scan()
    assert found.runtime_text == {
        both: [(0x7f0000010000, 0x7f0000090000), (0x7f3000000000, 0x7f3000008000)],
        driver_only: [],                  # known to have no runtime: its driver launches are its own
        static: [(0x400000, 0x500000)],   # cudart linked into the executable
    }
