"""The results table (stdout, README) and the JSON file."""
from __future__ import annotations

import json
from pathlib import Path


def table(machine: dict, rows: list) -> str:
    head = (f"machine: {machine['cpu']}, {machine['cores']} cores, {machine['memory_gib']} GiB, "
            f"kernel {machine['kernel']}, GPU: {machine['gpu']} (host {machine['host']})")
    cells = [("item", "measure", "value", "target", "met")] + [
        (i, m, v, t, "" if ok is None else ("yes" if ok else "NO")) for i, m, v, t, ok in rows]
    widths = [max(len(str(r[c])) for r in cells) for c in range(5)]
    lines = ["| " + " | ".join(str(x).ljust(w) for x, w in zip(r, widths)) + " |" for r in cells]
    lines.insert(1, "|" + "|".join("-" * (w + 2) for w in widths) + "|")
    return head + "\n\n" + "\n".join(lines)


def profile_text(name: str, prof: dict, top: int = 8) -> str:
    if not prof or "error" in prof:
        return f"{name}: no profile ({(prof or {}).get('error', 'not run')})"
    lines = [f"{name}: {prof['samples']} samples (py-spy, non-idle); top by self % | top by inclusive %"]
    for (fs, ps), (fi, pi) in zip(prof["self"][:top], prof["inclusive"][:top]):
        lines.append(f"  {ps:5.1f}% {fs[:70]:<70} | {pi:5.1f}% {fi[:70]}")
    return "\n".join(lines)


def write_json(path: Path, data: dict) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(json.dumps(data, indent=2, default=str) + "\n")
