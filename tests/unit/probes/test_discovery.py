"""Discovery's no-blind-start parts: the well-known CUDA library files it probes
before any process maps them, and a scan of only the processes just seen loading a
library (fake /proc tree from the groups tests)."""
import os

from otel_gpu.probes.discovery import Discovery, known_library_files
from otel_gpu.cuda_calls import DRIVER, RUNTIME
from tests.unit.pipeline.test_groups import CUDA_MAPS, Tree


def test_known_files_each_once_by_kind(tmp_path):
    root = tmp_path / "host"
    toolkit = root / "usr/local/cuda-12.4/lib64"
    driver = root / "usr/lib/x86_64-linux-gnu"
    site = tmp_path / "venv/lib/python3.11/site-packages"
    wheel = site / "nvidia/cuda_runtime/lib"
    for d in (toolkit, driver, wheel):
        d.mkdir(parents=True)
    (toolkit / "libcudart.so.12.4.127").write_text("")
    os.symlink("libcudart.so.12.4.127", toolkit / "libcudart.so.12")  # the same file: once
    (driver / "libcuda.so.550.54").write_text("")
    (driver / "libcudnn.so.9").write_text("")  # not CUDA's runtime or driver
    (wheel / "libcudart.so.12").write_text("")
    found = known_library_files(str(root), [str(site)])
    assert sorted((t.kind, os.path.basename(t.path)) for t in found) == [
        (DRIVER, "libcuda.so.550.54"), (RUNTIME, "libcudart.so.12"), (RUNTIME, "libcudart.so.12")]
    assert len({t.key for t in found}) == 3
    assert known_library_files(str(tmp_path / "empty"), []) == []


def test_scan_of_only_some_processes(tmp_path):
    tree = Tree(tmp_path)
    tree.add(1, 0)
    a = tree.add(100, 1, maps=CUDA_MAPS)
    b = tree.add(200, 1, maps=CUDA_MAPS)
    plain = tree.add(300, 1)
    d = Discovery(tree.path, has_static_cudart=lambda p: False)
    assert d.scan().cuda_pids == {a, b}
    assert d.scan({b, plain, 999}).cuda_pids == {b}  # 999: gone already
    assert Discovery(tree.path, pid_filter=lambda pid: pid != b,
                     has_static_cudart=lambda p: False).scan({b}).cuda_pids == set()  # filters apply
