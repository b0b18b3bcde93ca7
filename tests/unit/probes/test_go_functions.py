"""probes/go_functions.py on real Go binaries (oldest and newest toolchain setup
installs, stripped and not): every runtime function the Go probes need is found in
.gopclntab at the address the toolchain's own `go tool nm` gives for the binary with
symbols (Go 1.26+ no longer stores textStart: the moduledata gives it). A file with no
Go function table: nothing."""
from __future__ import annotations

import subprocess

import pytest

from otel_gpu.probes.elf_file import ElfFile
from otel_gpu.probes.go_functions import addresses
from otel_gpu.cuda_calls import GO_PROBES
from tests.bpf.targets.go.build import build, toolchains

TOOLCHAINS = toolchains()
NAMES = [r.symbol for r in GO_PROBES] + ["runtime.ready", "main.main"]


def _nm(go, binary) -> dict:
    out = subprocess.run([str(go), "tool", "nm", str(binary)], capture_output=True, text=True, check=True).stdout
    return {f[2]: int(f[0], 16) for f in (line.split() for line in out.splitlines()) if len(f) == 3}


@pytest.mark.skipif(not TOOLCHAINS, reason="no Go toolchain under .go/ (scripts/setup.sh installs them)")
@pytest.mark.parametrize("version", sorted(TOOLCHAINS) or ["none"])
def test_runtime_functions_are_found_stripped_or_not(version):
    go = TOOLCHAINS[version]
    want = {n: a for n, a in _nm(go, build("goroutines.go", go, False)).items() if n in NAMES}
    assert set(want) == set(NAMES)
    for stripped in (False, True):
        with open(build("goroutines.go", go, stripped), "rb") as f:
            assert addresses(ElfFile(f), NAMES) == want, (version, stripped)


def test_a_file_with_no_go_function_table_gives_nothing():
    with open("/bin/sh", "rb") as f:
        assert addresses(ElfFile(f), NAMES) == {}
