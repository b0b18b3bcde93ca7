"""DT_INIT's address from a library's dynamic section (probes/elf_init.py), checked
against readelf on real files gcc builds, and None for what has no DT_INIT."""
import re
import shutil
import subprocess

import pytest

from otel_gpu.probes.elf_init import init_address

pytestmark = pytest.mark.skipif(not (shutil.which("gcc") and shutil.which("readelf")), reason="needs gcc and readelf")


def _build(tmp_path, *flags) -> str:
    src = tmp_path / "lib.c"
    src.write_text("int f(int x) { return x + 1; }\n")
    out = tmp_path / f"lib{len(flags)}.so"
    subprocess.run(["gcc", "-shared", "-fPIC", *flags, "-o", str(out), str(src)], check=True)
    return str(out)


def _readelf_init(path: str):
    text = subprocess.run(["readelf", "-d", path], capture_output=True, text=True, check=True).stdout
    m = re.search(r"\(INIT\)\s+0x([0-9a-f]+)", text)
    return int(m.group(1), 16) if m else None


def test_init_address_is_readelfs(tmp_path):
    lib = _build(tmp_path)
    assert _readelf_init(lib) is not None
    assert init_address(lib) == _readelf_init(lib)


def test_no_dt_init_no_address(tmp_path):
    lib = _build(tmp_path, "-nostartfiles")
    assert _readelf_init(lib) is None
    assert init_address(lib) is None


def test_not_an_elf_or_truncated(tmp_path):
    text = tmp_path / "text"
    text.write_text("hello\n")
    cut = tmp_path / "cut.so"
    cut.write_bytes(open(_build(tmp_path), "rb").read()[:100])
    assert init_address(str(text)) is None
    assert init_address(str(cut)) is None
    assert init_address(str(tmp_path / "absent")) is None
