"""py-spy on the running collector: collapsed stacks for a fixed time, then the
top functions by own samples (self) and by samples under them (inclusive)."""
from __future__ import annotations

import shutil
import subprocess
import sys
from collections import Counter
from pathlib import Path


def py_spy() -> str | None:
    local = Path(sys.executable).with_name("py-spy")
    return str(local) if local.exists() else shutil.which("py-spy")


class Profile:
    """Starts `py-spy record` on pid for `seconds`; result() waits and summarises."""

    def __init__(self, pid: int, seconds: int, out: Path, rate: int = 100) -> None:
        self.out = out
        exe = py_spy()
        self.proc = None if exe is None else subprocess.Popen(
            [exe, "record", "--pid", str(pid), "--duration", str(seconds), "--rate", str(rate),
             "--format", "raw", "--output", str(out), "--nonblocking"],
            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True)

    def result(self, top: int = 12) -> dict:
        if self.proc is None:
            return {"error": "py-spy not installed (pip install py-spy)"}
        _, err = self.proc.communicate(timeout=700)
        if not self.out.exists():
            return {"error": err.strip()[-300:]}
        return summarise(self.out.read_text(), top) | {"file": str(self.out)}


def _short(frame: str) -> str:
    """'poll (otel_gpu/kernel_io/reader.py:31)' -> 'poll (kernel_io/reader.py:31)'."""
    name, _, where = frame.partition(" (")
    if "/" in where:
        parts = where.rstrip(")").split("/")
        where = "/".join(parts[-2:]) + ")"
    return f"{name} ({where}" if where else name


def _function(frame: str) -> str:
    """Frame without its line number, so lines of one function add up."""
    f = _short(frame)
    return f.rsplit(":", 1)[0] + ")" if f.endswith(")") and ":" in f else f


WRAPPERS = ("<frozen runpy>", "cli.py)", "threading.py)", "<module>")


def summarise(collapsed: str, top: int) -> dict:
    own, under, total = Counter(), Counter(), 0
    for line in collapsed.splitlines():
        stack, _, n = line.rpartition(" ")
        if not stack or not n.isdigit():
            continue
        n = int(n)
        frames = [_function(f) for f in stack.split(";")]
        total += n
        if frames:
            own[frames[-1]] += n
        for f in set(frames):
            if not any(w in f for w in WRAPPERS):  # entry frames: 100% of everything
                under[f] += n
    pct = lambda c: [(f, round(100 * v / total, 1)) for f, v in c.most_common(top)] if total else []
    return {"samples": total, "self": pct(own), "inclusive": pct(under)}
