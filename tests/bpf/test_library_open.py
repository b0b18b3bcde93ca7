"""bpf/library_probes.c's open watch in the real kernel: a process that opens a CUDA
runtime, driver, NCCL/RCCL, HIP or device-clock library file under any directory (or, once
traced, a libssl) is put in `loaded` for user space to scan, with the kind it opened (the
value's LIB_* bit; opens before user space reads it add theirs); any other name is not. Real
openat(2) and open(2) calls from a child process; the files need not exist (the name is
read at entry)."""
from __future__ import annotations

import ctypes as ct
import sys

import pytest

from otel_gpu.kernel_io.abi import LIB_CUDART, LIB_DEVICE_CLOCK, LIB_DRIVER, LIB_HIP, LIB_NCCL, LIB_SSL
from tests.bpf.probe_harness import Child

# Opens each path given on stdin, with openat (Python's os.open) or with open(2) itself.
OPENER = r'''
import ctypes, json, os, sys
libc = ctypes.CDLL(None, use_errno=True)
print("{}", flush=True)
for line in sys.stdin:
    call, path = line.split(" ", 1)
    path = path.rstrip("\n")
    try:
        if call == "open":
            fd = libc.syscall(2, path.encode(), os.O_RDONLY)  # SYS_open on x86-64
            if fd >= 0:
                os.close(fd)
        else:
            os.close(os.open(path, os.O_RDONLY))
    except OSError:
        pass
    print("{}", flush=True)
'''

LONG_DIR = "/tmp/" + "d" * 200

FLAGGED = [  # (path, the kind it is flagged as)
    ("/opt/app/.venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12", LIB_CUDART),
    ("/proc/1234/root/usr/local/cuda-13.0/lib/libcudart.so.13", LIB_CUDART),
    ("/tmp/x/libcudart-d0da41ae.so.11.0", LIB_CUDART),   # torch wheels' renamed copies
    ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", LIB_DRIVER),
    ("/opt/conda/lib/libnccl.so.2", LIB_NCCL),
    ("/opt/rocm/lib/librccl.so.1", LIB_NCCL),
    ("/usr/lib/x86_64-linux-gnu/libamdhip64.so.5", LIB_HIP),
    ("/opt/otel-gpu/libotel_gpu_cupti.so", LIB_DEVICE_CLOCK),
    (f"{LONG_DIR}/libcudart.so.12", LIB_CUDART),          # a long directory: the name is read from the end
    ("libcudart.so.12", LIB_CUDART),                      # relative, no directory
]
NOT_FLAGGED = [
    "/tmp/x/libcurl.so.4",
    "/tmp/x/notlibcudart.so.12",
    "/tmp/libcudart.so.12/readme.txt",     # the directory's name is not the file's
    "/tmp/x/libcuda_wrapper.txt",
    "/tmp/x/libpython3.11.so.1.0",
    "/usr/lib/x86_64-linux-gnu/libssl.so.3",  # libssl: only once the process is traced
    "/tmp/x/lib" + "c" * 80 + "cudart.so",  # a basename past LIB_NAME_MAX
]


@pytest.fixture
def opener():
    child = Child([sys.executable, "-c", OPENER])
    yield child
    child.stop()


def _loaded(probes) -> dict:
    table = probes.bpf["loaded"]
    opened = {k.value: v.value for k, v in table.items()}
    table.clear()
    return opened


@pytest.mark.parametrize("call", ["openat", "open"])
@pytest.mark.parametrize("path,kind", FLAGGED)
def test_a_cuda_library_opened_anywhere_is_flagged(probes, opener, call, path, kind):
    _loaded(probes)
    opener.run(f"{call} {path}")
    assert _loaded(probes).get(opener.pid) == kind


@pytest.mark.parametrize("path", NOT_FLAGGED)
def test_other_names_are_not(probes, opener, path):
    _loaded(probes)
    opener.run(f"openat {path}")
    assert opener.pid not in _loaded(probes)


def test_opens_before_user_space_reads_add_their_kinds(probes, opener):
    """libcuda, then the device-clock library (the driver loads it at cuInit), then libcuda
    again: one entry, whose value names both kinds, once each."""
    _loaded(probes)
    for path in ("/usr/lib/x86_64-linux-gnu/libcuda.so.1", "/opt/otel-gpu/libotel_gpu_cupti.so",
                 "/usr/lib/x86_64-linux-gnu/libcuda.so.1"):
        opener.run(f"openat {path}")
    assert _loaded(probes).get(opener.pid) == LIB_DRIVER | LIB_DEVICE_CLOCK


def test_libssl_is_flagged_once_the_process_is_traced(probes, opener):
    _loaded(probes)
    probes.set("traced", opener.pid, ct.c_uint32(1))
    try:
        opener.run("openat /usr/lib/x86_64-linux-gnu/libssl.so.3")
        assert _loaded(probes).get(opener.pid) == LIB_SSL
    finally:
        probes.unset("traced", opener.pid)
