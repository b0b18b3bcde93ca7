"""Prints, for each library a process maps that the collector probes, the first bytes of
every function it probes and where the probe goes (probes/prologue.py): the data behind
the per-call cost on a host (a single-stepped entry costs ~15x an emulated push; bench
item 15). `python scripts/probe_entries.py PID` (root: it reads /proc/PID/maps)."""
from __future__ import annotations

import re
import sys
from pathlib import Path

from bcc import BPF

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # run as a file, from any venv
from otel_gpu.cuda_calls import DRIVER, NCCL, PYTHON, RUNTIME, TLS  # noqa: E402
from otel_gpu.probes.rows import rows_for  # noqa: E402
from otel_gpu.probes.prologue import entry_skip  # noqa: E402

KINDS = ((r"libcudart\.so", RUNTIME), (r"libcuda\.so", DRIVER), (r"libnccl\.so", NCCL),
         (r"libpython3\.\d+\.so|/python3\.\d+$", PYTHON), (r"libssl\.so", TLS))


def main(pid: int) -> None:
    files = sorted({line.split()[-1] for line in open(f"/proc/{pid}/maps") if line.split()[-1].startswith("/")})
    for path in files:
        kind = next((k for pattern, k in KINDS if re.search(pattern, path)), None)
        if kind is None:
            continue
        for row in rows_for(kind):
            try:
                _, offset = BPF._check_path_symbol(f"/proc/{pid}/root{path}".encode(), row.symbol.encode(), None, -1)
            except Exception:
                continue  # not in this build
            with open(f"/proc/{pid}/root{path}", "rb") as f:
                f.seek(offset)
                head = f.read(8).hex()
            print(f"{path.rsplit('/', 1)[-1]:<28} {row.symbol:<32} {head}  skip {entry_skip(f'/proc/{pid}/root{path}', offset)}")


if __name__ == "__main__":
    main(int(sys.argv[1]))
