"""probes/go_functions.py on real Go binaries (oldest and newest toolchain setup
installs, stripped and not): every runtime function the Go probes need, and the HTTP/2
server's reader and handler functions of that release, are found in
.gopclntab at the address the toolchain's own `go tool nm` gives for the binary with
symbols (Go 1.26+ no longer stores textStart: the moduledata gives it). A file with no
Go function table: nothing."""
from __future__ import annotations

import subprocess

import pytest

from otel_gpu.probes.elf_file import ElfFile
from otel_gpu.probes.go_functions import addresses
from otel_gpu.probes.prologue import emulated, entry_code, skip
from otel_gpu.probes.rows import GO_PROBES
from tests.bpf.targets.go.build import build, toolchains

TOOLCHAINS = toolchains()
RUNTIME = [r.symbol for r in GO_PROBES if r.symbol.startswith("runtime.")] + ["runtime.ready", "main.main"]
HTTP2 = [r.symbol for r in GO_PROBES if not r.symbol.startswith("runtime.")]  # one package per release
NAMES = RUNTIME + HTTP2


def _nm(go, binary) -> dict:
    out = subprocess.run([str(go), "tool", "nm", str(binary)], capture_output=True, text=True, check=True).stdout
    return {f[2]: int(f[0], 16) for f in (line.split() for line in out.splitlines()) if len(f) == 3}


@pytest.mark.skipif(not TOOLCHAINS, reason="no Go toolchain under .go/ (scripts/setup.sh installs them)")
@pytest.mark.parametrize("version", sorted(TOOLCHAINS) or ["none"])
def test_runtime_functions_are_found_stripped_or_not(version):
    go = TOOLCHAINS[version]
    want = {n: a for n, a in _nm(go, build("server.go", go, False)).items() if n in NAMES}
    assert set(RUNTIME) <= set(want)
    assert len(set(want) & set(HTTP2)) == 2, want  # its net/http server's HTTP/2 reader and handler
    for stripped in (False, True):
        with open(build("server.go", go, stripped), "rb") as f:
            assert addresses(ElfFile(f), NAMES) == want, (version, stripped)


@pytest.mark.skipif(not TOOLCHAINS, reason="no Go toolchain under .go/ (scripts/setup.sh installs them)")
@pytest.mark.parametrize("version", sorted(TOOLCHAINS) or ["none"])
def test_no_go_probe_is_single_stepped(version):
    """Each function the Go probes take starts with Go's stack check, which x86 single-steps:
    the probe goes on the push after it (prologue.skip), which it emulates."""
    path = str(build("server.go", TOOLCHAINS[version], True))
    with open(path, "rb") as f:
        found = addresses(ElfFile(f), NAMES)
    for name in set(NAMES) & set(found) - {"runtime.ready", "main.main"}:
        code = entry_code(path, addr=found[name])
        assert code[0] in (0x49, 0x4C), (name, code.hex())  # cmp or lea: the stack check, single-stepped
        assert skip(code) > 0 and emulated(code), (version, name, code.hex())  # on the push after it


def test_a_file_with_no_go_function_table_gives_nothing():
    with open("/bin/sh", "rb") as f:
        assert addresses(ElfFile(f), NAMES) == {}
