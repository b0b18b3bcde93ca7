"""bpf/library_probes.c's open watch in the real kernel: a process that opens a CUDA
runtime, driver or NCCL file under any directory (or, once traced, a libssl) is put in
`loaded` for user space to scan; any other name is not. Real openat(2) and open(2)
calls from a child process; the files need not exist (the name is read at entry)."""
from __future__ import annotations

import ctypes as ct
import sys

import pytest

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

FLAGGED = [
    "/opt/app/.venv/lib/python3.11/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12",
    "/proc/1234/root/usr/local/cuda-13.0/lib/libcudart.so.13",
    "/tmp/x/libcudart-d0da41ae.so.11.0",   # torch wheels' renamed copies
    "/usr/lib/x86_64-linux-gnu/libcuda.so.1",
    "/opt/conda/lib/libnccl.so.2",
    f"{LONG_DIR}/libcudart.so.12",          # a long directory: the name is read from the end
    "libcudart.so.12",                      # relative, no directory
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


def _loaded(probes) -> set:
    table = probes.bpf["loaded"]
    pids = {k.value for k in table.keys()}
    table.clear()
    return pids


@pytest.mark.parametrize("call", ["openat", "open"])
@pytest.mark.parametrize("path", FLAGGED)
def test_a_cuda_library_opened_anywhere_is_flagged(probes, opener, call, path):
    _loaded(probes)
    opener.run(f"{call} {path}")
    assert opener.pid in _loaded(probes)


@pytest.mark.parametrize("path", NOT_FLAGGED)
def test_other_names_are_not(probes, opener, path):
    _loaded(probes)
    opener.run(f"openat {path}")
    assert opener.pid not in _loaded(probes)


def test_libssl_is_flagged_once_the_process_is_traced(probes, opener):
    _loaded(probes)
    probes.set("traced", opener.pid, ct.c_uint32(1))
    try:
        opener.run("openat /usr/lib/x86_64-linux-gnu/libssl.so.3")
        assert opener.pid in _loaded(probes)
    finally:
        probes.unset("traced", opener.pid)
