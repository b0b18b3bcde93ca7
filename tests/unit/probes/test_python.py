"""probes/python.py: the runtime layouts (recompiled against every CPython header set
found here, and read back from each of those interpreters' own memory through the C
API), interpreter recognition from maps text and names, Py_Version and _PyRuntime read
from ELF files, and discovery reporting a CUDA process's interpreter."""
import glob
import os
import re
import shutil
import subprocess
import sys
from pathlib import Path

import pytest

from otel_gpu.probes import python
from otel_gpu.probes.elf_file import ElfFile
from otel_gpu.probes.discovery import Discovery
from otel_gpu.cuda_calls import BY_ID, PYTHON, RUNTIME
from otel_gpu.probes.rows import CUDA_PROBES, PYTHON_PROBES, rows_for

GCC = shutil.which("gcc")
HEADER_DIRS = sorted(glob.glob("/root/.pyenv/versions/3.*/include/python3.*") + glob.glob("/usr/include/python3.*"))
INTERPRETERS = sorted(glob.glob("/root/.pyenv/versions/3.*/bin/python3") + ["/usr/bin/python3", sys.executable])
# The runtime structures are internal: their headers, by version (3.7: internal/pystate.h).
LAYOUT_C = r"""
#define Py_BUILD_CORE 1
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
#if PY_MINOR_VERSION == 7
#include "internal/pystate.h"
#elif PY_MINOR_VERSION == 8
#include "internal/pycore_pystate.h"
#else
#include "internal/pycore_runtime.h"
#include "internal/pycore_interp.h"
#endif
#if PY_MINOR_VERSION >= 11
#define THREADS_HEAD threads.head
#else
#define THREADS_HEAD tstate_head
#endif
int main(void)
{
#ifdef Py_DEBUG
    return 3;
#endif
    printf("%d %d %zu %zu %zu %zu %zu\n", PY_MAJOR_VERSION, PY_MINOR_VERSION,
           offsetof(_PyRuntimeState, interpreters.main), offsetof(PyInterpreterState, THREADS_HEAD),
           offsetof(PyThreadState, thread_id), offsetof(PyThreadState, context), offsetof(PyThreadState, next));
    return 0;
}
"""
# Run by each interpreter: its own layout read back through the C API (ctypes).
LAYOUT_PY = r"""
import ctypes as ct, sys, threading
main_interp, threads_head, thread_id, context = map(int, sys.argv[1:])
api, read = ct.pythonapi, lambda at: ct.c_uint64.from_address(at).value
runtime = ct.addressof(ct.c_char.in_dll(api, "_PyRuntime"))
main = getattr(api, "PyInterpreterState_Main", None) or api.PyInterpreterState_Head  # 3.8+ / 3.7
for f in (main, api.PyInterpreterState_ThreadHead, api.PyThreadState_Get, api.PyThreadState_Next):
    f.restype = ct.c_void_p
api.PyInterpreterState_ThreadHead.argtypes = api.PyThreadState_Next.argtypes = [ct.c_void_p]
interp, me = main(), api.PyThreadState_Get()
assert read(runtime + main_interp) == interp, "interpreters.main"
assert read(interp + threads_head) == api.PyInterpreterState_ThreadHead(interp), "threads.head"
assert read(me + thread_id) == threading.get_ident(), "thread_id"
assert read(me + 8) == (api.PyThreadState_Next(me) or 0), "next"
import contextvars
ctx = contextvars.copy_context()
assert ctx.run(lambda: read(api.PyThreadState_Get() + context)) == id(ctx), "context"
print("ok")
"""


def _internal_headers(include: str) -> bool:
    m = re.search(r"python3\.(\d+)", include)
    return bool(m) and int(m.group(1)) >= 7 and os.path.isdir(os.path.join(include, "internal"))


@pytest.mark.parametrize("include", HEADER_DIRS)
def test_layout_matches_the_headers(include, tmp_path):
    if GCC is None:
        pytest.skip("gcc is not installed: cannot compile against the CPython headers")
    if not _internal_headers(include):
        pytest.skip(f"{include}: before 3.7, or without the internal headers")
    (tmp_path / "off.c").write_text(LAYOUT_C)
    build = subprocess.run([GCC, f"-I{include}", "-o", str(tmp_path / "off"), str(tmp_path / "off.c")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    major, minor, *offsets, tstate_next = map(int, subprocess.run(
        [str(tmp_path / "off")], capture_output=True, text=True, check=True).stdout.split())
    assert python.LAYOUTS.get((major, minor)) == python.Layout(*offsets), f"3.{minor}: {offsets}"
    assert tstate_next == python.TSTATE_NEXT  # PY_TSTATE_NEXT in bpf/python_probes.c


@pytest.mark.parametrize("interpreter", INTERPRETERS)
def test_layout_matches_the_running_interpreter(interpreter):
    if not os.path.exists(interpreter):
        pytest.skip(f"no {interpreter} here")
    version = tuple(int(x) for x in subprocess.run(
        [interpreter, "-c", "import sys; print(*sys.version_info[:2])"], capture_output=True, text=True,
        check=True).stdout.split())
    if version not in python.LAYOUTS:
        pytest.skip(f"{interpreter}: {version} is not in the table")
    out = subprocess.run([interpreter, "-c", LAYOUT_PY, *map(str, python.LAYOUTS[version])],
                         capture_output=True, text=True, timeout=60)
    assert out.stdout.strip() == "ok", out.stderr


def test_the_table_covers_3_7_to_3_13():
    assert {(3, m) for m in range(7, 14)} <= set(python.LAYOUTS)
    if not [d for d in HEADER_DIRS if _internal_headers(d)]:
        pytest.skip("no CPython headers here: the offsets are unchecked")


MAPS = """\
55d0c0a00000-55d0c0a01000 r--p 00000000 fe:00 1 /root/.pyenv/versions/3.12.1/bin/python3.12
7f0000000000-7f0000100000 r-xp 00000000 fe:00 2 /root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0
7f0000200000-7f0000300000 r-xp 00000000 fe:00 3 /opt/venv/lib/python3.12/site-packages/nvidia/cuda_runtime/lib/libcudart.so.12
7ffd00000000-7ffd00001000 rw-p 00000000 00:00 0 [stack]
"""


def test_libpython_in_maps():
    assert python.libpython_in_maps(MAPS) == "/root/.pyenv/versions/3.12.1/lib/libpython3.12.so.1.0"
    deleted = "7f00-7f01 r-xp 0 fe:00 9 /usr/lib/libpython3.11d.so.1.0 (deleted)\n"
    assert python.libpython_in_maps(deleted) == "/usr/lib/libpython3.11d.so.1.0"
    # the stable-ABI shim and free-threaded builds are not taken
    for other in ("/usr/lib/libpython3.so", "/usr/lib/libpython3.13t.so.1.0", "/x/libpython3.12.so.py"):
        assert python.libpython_in_maps(f"7f00-7f01 r-xp 0 fe:00 9 {other}\n") is None
    assert python.libpython_in_maps(MAPS.replace("libpython3.12.so.1.0", "libfoo.so")) is None


@pytest.mark.parametrize("name,version", [
    ("/usr/bin/python3.11", (3, 11)), ("/usr/local/bin/python3.13", (3, 13)), ("python3.12d", (3, 12)),
    ("/usr/bin/python3.11 (deleted)", (3, 11)), ("/opt/lib/libpython3.10.so.1.0", (3, 10)),
    ("/x/libpython3.7m.so.1.0", (3, 7)),
    ("/usr/bin/python3", None), ("/usr/bin/python", None), ("/usr/bin/python3.13t", None),
    ("/usr/bin/python3.11-config", None), ("/usr/bin/uvicorn", None),
])
def test_version_of_name(name, version):
    assert python.version_of_name(name) == version


def _shared(tmp_path: Path, body: str, name: str = "libv.so") -> str:
    if GCC is None:
        pytest.skip("gcc is not installed")
    (tmp_path / "v.c").write_text(body)
    out = tmp_path / name
    subprocess.run([GCC, "-shared", "-fPIC", "-o", str(out), str(tmp_path / "v.c")], check=True)
    return str(out)


def test_exported_version_reads_py_version(tmp_path):
    lib = _shared(tmp_path, "const unsigned long Py_Version = 0x030C01F0;\nint other = 1;\n")
    assert python.exported_version(lib) == (3, 12)
    assert python.exported_version(_shared(tmp_path, "int x = 1;\n", "libx.so")) is None
    (tmp_path / "text").write_text("not an ELF file")
    assert python.exported_version(str(tmp_path / "text")) is None
    assert python.exported_version(str(tmp_path / "absent")) is None


def test_exported_version_of_real_interpreters():
    """Debian's stripped 3.11 exports Py_Version; before 3.11 there is none."""
    checked = 0
    for path, want in [("/usr/bin/python3.11", (3, 11))] + [
            (p, (3, int(re.search(r"libpython3\.(\d+)", p).group(1))))
            for p in glob.glob("/root/.pyenv/versions/3.*/lib/libpython3.*.so.1.0")]:
        if os.path.exists(path):
            assert python.exported_version(path) == (want if want >= (3, 11) else None), path
            checked += 1
    if not checked:
        pytest.skip("no CPython interpreter here")


def test_exe_version_by_name_then_by_symbol(tmp_path):
    lib = _shared(tmp_path, "const unsigned long Py_Version = 0x030B04F0;\n", "renamed-interpreter")
    assert python.exe_version("/usr/bin/python3.12", lib) == (3, 12)  # the name wins
    assert python.exe_version("/app/server", lib) == (3, 11)
    assert python.exe_version("/app/server", str(tmp_path / "absent")) is None


def _fake_proc(tmp_path: Path, pid: int, maps: str, exe: str) -> None:
    d = tmp_path / "proc" / str(pid)
    d.mkdir(parents=True)
    (d / "maps").write_text(maps)
    os.symlink(exe, d / "exe")
    os.symlink("/", d / "root")


def test_discovery_reports_the_interpreter_of_cuda_processes(tmp_path):
    runtime_lib = _shared(tmp_path, "char _PyRuntime[8192];\n", "libruntime.so")  # exports _PyRuntime
    files = {n: tmp_path / "f" / n for n in ("libcudart.so.12", "libpython3.12.so.1.0", "python3.12",
                                             "python3.11", "python3.99", "tool", "python3.10")}
    for name, p in files.items():
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"x" if name in ("libcudart.so.12", "tool", "python3.10") else Path(runtime_lib).read_bytes())
    line = "{:x}-{:x} r-xp 0 fe:00 1 {}\n".format
    cudart = line(0x7e00, 0x7e01, files["libcudart.so.12"])
    _fake_proc(tmp_path, 10, cudart + line(0x7f00, 0x7f01, files["libpython3.12.so.1.0"]), str(files["python3.12"]))
    # a stripped static interpreter, mapped at its own address
    _fake_proc(tmp_path, 11, cudart + line(0x5500, 0x5501, files["python3.11"]), str(files["python3.11"]))
    _fake_proc(tmp_path, 12, cudart, str(files["python3.99"]))  # a version not in the table
    _fake_proc(tmp_path, 13, cudart, str(files["tool"]))        # not Python
    _fake_proc(tmp_path, 14, line(0x7f00, 0x7f01, files["libpython3.12.so.1.0"]), str(files["python3.12"]))  # no CUDA
    _fake_proc(tmp_path, 15, cudart, str(files["python3.10"]))  # named so, without _PyRuntime
    found = Discovery(str(tmp_path / "proc"), has_static_cudart=lambda p: False).scan()
    assert found.cuda_pids == {10, 11, 12, 13, 15}
    with open(runtime_lib, "rb") as f:
        elf = ElfFile(f)
        runtime = elf.symbol("_PyRuntime") - elf.load_vaddr()
    assert runtime > 0
    assert found.python == {
        10: python.PythonProcess(python.LAYOUTS[(3, 12)], 0x7f00 + runtime + python.LAYOUTS[(3, 12)].main_interp),
        11: python.PythonProcess(python.LAYOUTS[(3, 11)], 0x5500 + runtime + python.LAYOUTS[(3, 11)].main_interp)}
    interpreters = sorted(os.path.basename(t.path) for t in found.targets if t.kind == PYTHON)
    assert interpreters == ["libpython3.12.so.1.0", "python3.11"]
    assert [t.kind for t in found.targets].count(RUNTIME) == 1  # one file, probed once


def test_interpreter_found_in_real_files():
    """_PyRuntime is exported by every CPython 3.7+, stripped ones too (Debian's)."""
    checked = 0
    for path in ["/usr/bin/python3.11"] + glob.glob("/root/.pyenv/versions/3.*/lib/libpython3.*.so.1.0"):
        version = python.version_of_name(path)
        if os.path.exists(path) and version in python.LAYOUTS:
            found = python.interpreter(path, version)
            assert found is not None and found.runtime > 0 and found.layout == python.LAYOUTS[version], path
            checked += 1
    assert python.interpreter("/usr/bin/python3.11", (3, 99)) is None
    if not checked:
        pytest.skip("no CPython interpreter here")


def test_mapped_at_takes_the_file_offset_0_mapping():
    maps = ("5500-5600 r--p 00000000 fe:00 1 /usr/bin/python3.11\n"
            "5600-5700 r-xp 00100000 fe:00 1 /usr/bin/python3.11\n"
            "7f00-7f01 r-xp 00000000 fe:00 2 /usr/lib/libpython3.12.so.1.0 (deleted)\n")
    assert python.mapped_at(maps, "/usr/bin/python3.11") == 0x5500
    assert python.mapped_at(maps, "/usr/lib/libpython3.12.so.1.0") == 0x7f00
    assert python.mapped_at(maps, "/usr/bin/python3.12") is None


def test_python_rows_are_not_cuda_calls():
    assert rows_for(PYTHON) == list(PYTHON_PROBES)
    assert not set(PYTHON_PROBES) & set(CUDA_PROBES)
    assert all(r.library == PYTHON for r in PYTHON_PROBES)
    assert {r.symbol for r in PYTHON_PROBES} == {"PyContext_CopyCurrent"}  # no probe on the GIL
    assert not any(c.name.startswith("Py") for c in BY_ID.values())


def test_python_handlers_exist():
    text = (Path(__file__).resolve().parents[3] / "bpf" / "python_probes.c").read_text()
    defined = set(re.findall(r"^int\s+(\w+)\s*\(\s*struct pt_regs \*ctx\s*\)", text, flags=re.M))
    assert {r.entry for r in PYTHON_PROBES} | {r.ret for r in PYTHON_PROBES if r.ret} <= defined
