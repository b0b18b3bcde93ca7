"""probes/python.py: the PyThreadState.context offsets (recompiled against every
CPython header set found here), interpreter recognition from maps text and names,
Py_Version read from an ELF file, and discovery reporting a CUDA process's interpreter."""
import glob
import os
import re
import shutil
import subprocess
from pathlib import Path

import pytest

from otel_gpu.probes import python
from otel_gpu.probes.discovery import Discovery
from otel_gpu.cuda_calls import BY_ID, CUDA_PROBES, PYTHON, PYTHON_PROBES, RUNTIME, rows_for

GCC = shutil.which("gcc")
HEADER_DIRS = sorted(glob.glob("/root/.pyenv/versions/3.*/include/python3.*") + glob.glob("/usr/include/python3.*"))
OFFSET_C = r"""
#include <Python.h>
#include <stddef.h>
#include <stdio.h>
int main(void)
{
#ifdef Py_DEBUG
    return 3;
#endif
    printf("%d %d %zu\n", PY_MAJOR_VERSION, PY_MINOR_VERSION, offsetof(PyThreadState, context));
    return 0;
}
"""


def _has_context(include: str) -> bool:
    """contextvars exist since 3.7: older headers have no PyThreadState.context."""
    m = re.search(r"python3\.(\d+)", include)
    return bool(m) and int(m.group(1)) >= 7 and os.path.exists(os.path.join(include, "Python.h"))


@pytest.mark.parametrize("include", HEADER_DIRS)
def test_context_offset_matches_the_headers(include, tmp_path):
    if GCC is None:
        pytest.skip("gcc is not installed: cannot compile against the CPython headers")
    if not _has_context(include):
        pytest.skip(f"{include}: before 3.7 or incomplete, no PyThreadState.context")
    (tmp_path / "off.c").write_text(OFFSET_C)
    build = subprocess.run([GCC, f"-I{include}", "-o", str(tmp_path / "off"), str(tmp_path / "off.c")],
                           capture_output=True, text=True)
    assert build.returncode == 0, build.stderr
    major, minor, offset = map(int, subprocess.run([str(tmp_path / "off")], capture_output=True, text=True,
                                                   check=True).stdout.split())
    assert python.CONTEXT_OFFSET.get((major, minor)) == offset, f"add 3.{minor}: {offset} to CONTEXT_OFFSET"


def test_the_table_covers_3_9_to_3_13():
    assert {(3, m) for m in range(9, 14)} <= set(python.CONTEXT_OFFSET)
    if not [d for d in HEADER_DIRS if _has_context(d)]:
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


def test_unknown_versions_have_no_offset():
    assert python.context_offset((3, 99)) is None and python.context_offset(None) is None
    assert python.context_offset((3, 12)) == python.CONTEXT_OFFSET[(3, 12)]


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
    files = {n: tmp_path / "f" / n for n in ("libcudart.so.12", "libpython3.12.so.1.0", "python3.12",
                                             "python3.11", "python3.99", "tool")}
    for p in files.values():
        p.parent.mkdir(exist_ok=True)
        p.write_bytes(b"x")
    line = "7f00-7f01 r-xp 0 fe:00 1 {}\n".format
    cudart = line(files["libcudart.so.12"])
    _fake_proc(tmp_path, 10, cudart + line(files["libpython3.12.so.1.0"]), str(files["python3.12"]))
    _fake_proc(tmp_path, 11, cudart, str(files["python3.11"]))  # a stripped static interpreter
    _fake_proc(tmp_path, 12, cudart, str(files["python3.99"]))  # a version not in the table
    _fake_proc(tmp_path, 13, cudart, str(files["tool"]))        # not Python
    _fake_proc(tmp_path, 14, line(files["libpython3.12.so.1.0"]), str(files["python3.12"]))  # no CUDA
    found = Discovery(str(tmp_path / "proc"), has_static_cudart=lambda p: False).scan()
    assert found.cuda_pids == {10, 11, 12, 13}
    assert found.python == {10: python.CONTEXT_OFFSET[(3, 12)], 11: python.CONTEXT_OFFSET[(3, 11)]}
    interpreters = sorted(os.path.basename(t.path) for t in found.targets if t.kind == PYTHON)
    assert interpreters == ["libpython3.12.so.1.0", "python3.11"]
    assert [t.kind for t in found.targets].count(RUNTIME) == 1  # one file, probed once


def test_python_rows_are_not_cuda_calls():
    assert rows_for(PYTHON) == list(PYTHON_PROBES)
    assert not set(PYTHON_PROBES) & set(CUDA_PROBES)
    assert all(r.library == PYTHON for r in PYTHON_PROBES)
    assert {r.symbol for r in PYTHON_PROBES} == {"PyEval_RestoreThread", "PyEval_AcquireThread",
                                                  "PyContext_CopyCurrent"}
    assert not any(c.name.startswith("Py") for c in BY_ID.values())


def test_python_handlers_exist():
    text = (Path(__file__).resolve().parents[3] / "bpf" / "python_probes.c").read_text()
    defined = set(re.findall(r"^int\s+(\w+)\s*\(\s*struct pt_regs \*ctx\s*\)", text, flags=re.M))
    assert {r.entry for r in PYTHON_PROBES} | {r.ret for r in PYTHON_PROBES if r.ret} <= defined
