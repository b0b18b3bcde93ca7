"""Discovery's no-blind-start parts: the well-known CUDA library files it probes
before any process maps them, and a scan of only the processes just seen loading a
library; and what a full scan leaves unread (fake /proc tree from the groups tests)."""
import os

from otel_gpu.probes.discovery import CUDA_MARKS, QUIET_RESCAN_S, Discovery, known_library_files, libraries_in_maps
from otel_gpu.cuda_calls import DRIVER, HIP, NCCL, RUNTIME
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


def test_every_cuda_library_name_passes_the_quick_check():
    """libraries_in_maps skips maps text holding none of CUDA_MARKS: each name its
    patterns match holds one (a wheel's, a hashed copy's, the driver's, NCCL's), and text
    with look-alikes only is still read line by line, finding none."""
    paths = ["/usr/local/cuda-12.4/lib64/libcudart.so.12.4.127", "/opt/app/libcudart-d9b2a1f3.so.11.0",
             "/usr/lib/x86_64-linux-gnu/libcuda.so.550.54.15", "/venv/nvidia/nccl/lib/libnccl.so.2",
             "/overlay/x/libcudart.so (deleted)", "/usr/lib/x86_64-linux-gnu/libamdhip64.so.5.2.21153",
             "/opt/rocm-6.2.0/lib/libamdhip64.so.6", "/opt/rocm/lib/librccl.so.1",
             "/venv/torch/lib/libamdhip64.so"]
    for path in paths:
        line = f"7f00-7f01 r-xp 0 08:01 12 {path}\n"
        assert any(mark in line for mark in CUDA_MARKS) and len(libraries_in_maps(line)) == 1, path
    lookalikes = ("7f00-7f01 r-xp 0 08:01 12 /usr/lib/libcudnn.so.9\n7f02-7f03 r-xp 0 08:01 13 /usr/lib/libcudart.txt\n"
                  "7f04-7f05 r-xp 0 08:01 14 /opt/rocm/lib/libamdhip64_fake.a\n"
                  "7f06-7f07 r-xp 0 08:01 15 /opt/rocm/lib/libhsa-runtime64.so.1\n")
    assert libraries_in_maps(lookalikes) == []


def test_rocm_libraries_by_kind(tmp_path):
    """libamdhip64 is HIP; RCCL, which exports NCCL's API, is NCCL: found in maps and at the
    well-known places (Debian's, /opt/rocm*, PyTorch's ROCm wheels)."""
    maps = ("7f00-7f01 r-xp 0 08:01 12 /opt/rocm-6.2.0/lib/libamdhip64.so.6.2.60200\n"
            "7f02-7f03 r-xp 0 08:01 13 /opt/rocm-6.2.0/lib/librccl.so.1.0\n")
    assert sorted(libraries_in_maps(maps)) == [(HIP, "/opt/rocm-6.2.0/lib/libamdhip64.so.6.2.60200"),
                                               (NCCL, "/opt/rocm-6.2.0/lib/librccl.so.1.0")]
    root, site = tmp_path / "host", tmp_path / "venv/lib/python3.12/site-packages"
    for d in (root / "opt/rocm-6.2.0/lib", root / "usr/lib/x86_64-linux-gnu", site / "torch/lib"):
        d.mkdir(parents=True)
    (root / "opt/rocm-6.2.0/lib/libamdhip64.so.6").write_text("")
    (root / "opt/rocm-6.2.0/lib/librccl.so.1").write_text("")
    (root / "usr/lib/x86_64-linux-gnu/libamdhip64.so.5").write_text("")
    (site / "torch/lib/libamdhip64.so").write_text("")
    found = known_library_files(str(root), [str(site)])
    assert sorted((t.kind, os.path.basename(t.path)) for t in found) == [
        (HIP, "libamdhip64.so"), (HIP, "libamdhip64.so.5"), (HIP, "libamdhip64.so.6"), (NCCL, "librccl.so.1")]


def test_a_process_found_without_cuda_is_read_again_later_or_at_an_exec(tmp_path):
    """A full scan does not read again, for QUIET_RESCAN_S, the maps of a process it found
    using no CUDA: a library it loads later is scanned for at its open (scan(only)). After
    that time, or once its executable is another file (an exec), the full scan reads it."""
    tree = Tree(tmp_path)
    tree.add(1, 0)
    late, opened, execs = tree.add(100, 1), tree.add(200, 1), tree.add(300, 1)
    now = [1000.0]
    d = Discovery(tree.path, has_static_cudart=lambda p: False, clock=lambda: now[0])
    assert d.scan().cuda_pids == set()
    for pid in (late, opened, execs):  # each maps libcudart from now on
        (tmp_path / str(pid) / "maps").write_text(CUDA_MAPS)
        lib = tmp_path / str(pid) / "root" / "usr" / "lib"
        lib.mkdir(parents=True)
        (lib / "libcudart.so.12").write_text("")
    os.remove(tmp_path / str(execs) / "exe")
    os.symlink("/bin/sh", tmp_path / str(execs) / "exe")  # another file
    assert os.stat("/bin/sh").st_ino != os.stat("/bin/true").st_ino
    assert d.scan().cuda_pids == {execs}
    assert d.scan({opened}).cuda_pids == {opened}  # its open of the library: scanned at once
    now[0] += QUIET_RESCAN_S - 1
    assert d.scan().cuda_pids == {execs, opened}  # `late` not read again yet
    now[0] += 1
    assert d.scan().cuda_pids == {late, opened, execs}


def test_with_the_kernels_exec_list_a_quiet_process_is_read_again_only_at_its_exec(tmp_path):
    """With the kernel's list of processes that called exec (bpf/library_probes.c `execed`),
    a full scan reads nothing of a quiet process (not even a stat of its executable) until it
    is on that list, or QUIET_RESCAN_S passed; before the program runs (None) it stats."""
    tree = Tree(tmp_path)
    tree.add(1, 0)
    quiet, execs = tree.add(100, 1), tree.add(300, 1)
    now, execed = [1000.0], [set()]
    d = Discovery(tree.path, has_static_cudart=lambda p: False, clock=lambda: now[0], execed=lambda: execed[0])
    assert d.scan().cuda_pids == set()
    for pid in (quiet, execs):  # both map libcudart from now on; neither is another file
        (tmp_path / str(pid) / "maps").write_text(CUDA_MAPS)
        lib = tmp_path / str(pid) / "root" / "usr" / "lib"
        lib.mkdir(parents=True)
        (lib / "libcudart.so.12").write_text("")
    stats = []
    d._exe_key = lambda pid: stats.append(pid) or Discovery._exe_key(d, pid)
    assert d.scan().cuda_pids == set() and stats == []  # nothing read of either
    execed[0] = {execs}  # the kernel saw it exec
    assert d.scan().cuda_pids == {execs} and stats == [execs]
    execed[0] = None  # no program (yet): the stat tells an exec, as before
    assert d.scan().cuda_pids == {execs} and quiet in stats
    now[0] += QUIET_RESCAN_S
    execed[0] = set()
    assert d.scan().cuda_pids == {quiet, execs}
