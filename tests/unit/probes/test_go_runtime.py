"""probes/go_runtime.py on real Go binaries built with the toolchains setup installs
(oldest and newest supported), stripped and not: the version from the build info, the
runtime layout of that release, the TLS slot of g (-8 unless C thread-locals share the
block: then from runtime.tlsg, or not known when stripped). Not Go: None."""
from __future__ import annotations

import re
import subprocess
import sys

import pytest

from otel_gpu.probes import go_runtime
from tests.bpf.targets.go.build import build, toolchains

TOOLCHAINS = toolchains()
needs_go = pytest.mark.skipif(not TOOLCHAINS, reason="no Go toolchain under .go/ (scripts/setup.sh installs them)")


@needs_go
@pytest.mark.parametrize("stripped", [False, True], ids=["symbols", "stripped"])
@pytest.mark.parametrize("version", sorted(TOOLCHAINS) or ["none"])
def test_a_go_binary_is_recognised(version, stripped):
    info = go_runtime.inspect(str(build("goroutines.go", TOOLCHAINS[version], stripped)))
    assert info is not None and info.version == f"go{version}"
    assert info.layout == go_runtime.LAYOUTS[go_runtime.release(info.version)]
    assert info.tls_g == -8


def _code_tls_g(binary) -> set:
    """The FS offsets the program's own code loads g from (`mov %fs:DISP,%r14`), by objdump."""
    out = subprocess.run(["objdump", "-d", "--no-show-raw-insn", str(binary)], capture_output=True, text=True).stdout
    return {int(m.group(1), 16) - (1 << 64) for m in re.finditer(r"mov\s+%fs:0x([0-9a-f]+),%r14", out)}


@needs_go
@pytest.mark.parametrize("stripped", [False, True], ids=["symbols", "stripped"])
def test_c_thread_locals_move_g_or_make_it_unknown(stripped):
    """C `__thread` data in the executable: the system linker lays runtime.tlsg out with
    it, away from -8; the symbol table says where (the code agrees), a stripped binary
    does not: not known, never a guess."""
    version = sorted(TOOLCHAINS)[-1]
    binary = build("thread_locals.go", TOOLCHAINS[version], stripped)
    info = go_runtime.inspect(str(binary))
    assert info is not None and info.layout is not None
    if stripped:
        assert info.tls_g is None
    else:
        assert info.tls_g != -8 and _code_tls_g(binary) == {info.tls_g}


def test_release_numbers():
    assert go_runtime.release("go1.27.3") == (1, 27)
    assert go_runtime.release("go1.21rc2") == (1, 21)
    assert go_runtime.release("devel +abc") is None


def test_what_is_not_go(tmp_path):
    assert go_runtime.inspect(sys.executable) is None  # an ELF, not Go
    (tmp_path / "text").write_text("#!/bin/sh\n")
    assert go_runtime.inspect(str(tmp_path / "text")) is None
    assert go_runtime.inspect(str(tmp_path / "missing")) is None
    cut = tmp_path / "cut"
    cut.write_bytes(open(subprocess.check_output(["which", "true"], text=True).strip(), "rb").read()[:100])
    assert go_runtime.inspect(str(cut)) is None


def test_an_unknown_release_has_no_layout():
    assert go_runtime.LAYOUTS.get(go_runtime.release("go1.99.0")) is None
