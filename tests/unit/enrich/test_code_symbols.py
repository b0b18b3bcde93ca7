"""Code addresses of a live process named from its mapped files' ELF symbols: this test
process's own libc and libstdc++, and libcudart (the PyPI wheel) loaded by ctypes in a
child process: in this one, a later tier's collector would see pytest as a CUDA process
and trace it (its test receivers' connections then count in the connection table)."""
from __future__ import annotations

import ctypes
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu.demo.cuda_work import find_cudart
from otel_gpu.enrich.code_symbols import CodeSymbols
from otel_gpu.enrich.symbols import KernelNames

PID = os.getpid()


def address(lib: ctypes.CDLL, name: str) -> int:
    return ctypes.cast(getattr(lib, name), ctypes.c_void_p).value


# Loads the library named on each stdin line and prints the address of the symbol given
# with it ("path symbol"), keeping what it loaded mapped until stdin closes.
_LOADER = """
import ctypes, sys
for line in sys.stdin:
    path, name = line.split()
    lib = ctypes.CDLL(path)
    print(ctypes.cast(getattr(lib, name), ctypes.c_void_p).value, flush=True)
"""


class Loader:
    """A child process that loads libraries when asked: its pid and each symbol's address."""

    def __init__(self) -> None:
        self.proc = subprocess.Popen([sys.executable, "-c", _LOADER], stdin=subprocess.PIPE,
                                     stdout=subprocess.PIPE, text=True)
        self.pid = self.proc.pid

    def address(self, path, name: str) -> int:
        self.proc.stdin.write(f"{path} {name}\n")
        self.proc.stdin.flush()
        return int(self.proc.stdout.readline())

    def close(self) -> None:
        self.proc.stdin.close()
        self.proc.wait(10)


@pytest.fixture
def loader():
    child = Loader()
    yield child
    child.close()


def test_functions_are_named_at_their_start_and_inside():
    libc = ctypes.CDLL("libc.so.6")
    symbols = CodeSymbols()
    for name in ("getpid", "qsort", "mkdtemp"):
        assert symbols.name(PID, address(libc, name)) == name
        assert symbols.name(PID, address(libc, name) + 3) == name  # inside the function


def test_a_mangled_name_comes_out_demangled():
    stdcxx = ctypes.CDLL("libstdc++.so.6")
    names = KernelNames(symbols=CodeSymbols())
    assert names(PID, address(stdcxx, "_ZNSt6chrono3_V212system_clock3nowEv")) == \
        "std::chrono::_V2::system_clock::now()"


def test_a_module_loaded_after_a_lookup_is_found(loader):
    path = find_cudart()
    if path is None:
        pytest.skip("no libcudart here (make setup installs the wheel)")
    symbols = CodeSymbols()
    assert symbols.name(loader.pid, loader.address("libc.so.6", "getpid")) == "getpid"  # maps read now
    assert symbols.name(loader.pid, loader.address(path, "cudaLaunchKernel")) == "cudaLaunchKernel"


def test_a_deleted_library_is_named_through_its_mapping(tmp_path, loader):
    """A container's or an upgraded package's file: the path no longer opens, the
    mapping (/proc/<pid>/map_files, root only) still does."""
    path = find_cudart()
    if path is None:
        pytest.skip("no libcudart here (make setup installs the wheel)")
    if os.geteuid() != 0:
        pytest.skip("/proc/<pid>/map_files opens for root only")
    copy = tmp_path / "libcudart_deleted.so.12"
    shutil.copy(path, copy)
    at = loader.address(copy, "cudaMemcpy")
    copy.unlink()
    assert CodeSymbols().name(loader.pid, at) == "cudaMemcpy"


def test_a_hip_kernel_handle_is_named_from_its_data_symbol(tmp_path, loader):
    """hipcc's host code passes a kernel handle, an object in read-only data named with the
    kernel's mangled name (tests/bpf/targets/hip_kernels.c), where CUDA passes a stub's code."""
    lib = tmp_path / "libhipkernels.so"
    subprocess.run(["gcc", "-shared", "-fPIC", "-O1", "-o", str(lib),
                    str(Path(__file__).parents[2] / "bpf/targets/hip_kernels.c")], check=True)
    names = KernelNames(symbols=CodeSymbols())
    at = loader.address(lib, "_Z10vector_addPKfS0_Pfi")
    assert names(loader.pid, at) == "vector_add(float const*, float const*, float*, int)"
    assert names(loader.pid, loader.address(lib, "_Z10reduce_sumPKfPfi")) == "reduce_sum(float const*, float*, int)"


def test_unknown_addresses_and_gone_processes_are_none():
    symbols = CodeSymbols()
    assert symbols.name(PID, 0x1000) is None          # nothing mapped there
    assert symbols.name(PID, id(symbols)) is None      # mapped, not a file's code (the heap)
    assert symbols.name(2**22 + 1, 0x401000) is None   # above pid_max's default: no such process


def test_lookups_leave_every_descriptor_as_it_was():
    """bcc's symbolizer, used before, closed descriptors it never opened (code_symbols.py):
    here each lookup opens and closes its file, and nothing else."""
    libc = ctypes.CDLL("libc.so.6")
    canaries = [os.open("/dev/null", os.O_RDONLY) for _ in range(64)]
    try:
        before = sorted(os.listdir("/proc/self/fd"))
        symbols = CodeSymbols(max_files=1)  # files dropped and read again
        stdcxx = ctypes.CDLL("libstdc++.so.6")
        for _ in range(50):
            assert symbols.name(PID, address(libc, "qsort")) == "qsort"
            assert symbols.name(PID, address(stdcxx, "_ZNSt6chrono3_V212system_clock3nowEv")) is not None
            symbols.forget(PID)
        assert sorted(os.listdir("/proc/self/fd")) == before
        for fd in canaries:
            os.fstat(fd)
    finally:
        for fd in canaries:
            os.close(fd)
