"""The command line of an item that runs on its own, outside `python -m bench` (the GPU
hosts' items): one option of its own, --json FILE, the report printed."""
from __future__ import annotations

import argparse
import json
from pathlib import Path
from typing import Callable


def main(module: str, doc: str, option: str, kind: type, default, measure: Callable, report: Callable) -> int:
    ap = argparse.ArgumentParser(prog=f"python -m {module}", description=doc)
    ap.add_argument(option, type=kind, default=default)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    r = measure(getattr(a, option.lstrip("-").replace("-", "_")))
    print(report(r), flush=True)
    if a.json:
        a.json.write_text(json.dumps(r, indent=1, default=str))
    return 0
