"""Where the collector's state file lives and how it is written and read. The file
holds counts and process names only (no paths, no request data), so it is world
readable: an operator needs no root to run `otel-gpu status`."""
from __future__ import annotations

import json
import os
from typing import Mapping, Optional

from ..config import DEFAULT_STATUS_FILE as DEFAULT_PATH

INTERVAL_S = 2.0       # the collector rewrites the file this often
STALE_INTERVALS = 5    # older than this many intervals: the collector is gone or stuck
SCHEMA = 1


def default_status_path(env: Optional[Mapping[str, str]] = None) -> str:
    """OTEL_GPU_STATUS_FILE, else /run/otel-gpu/status.json."""
    env = os.environ if env is None else env
    return env.get("OTEL_GPU_STATUS_FILE", "").strip() or DEFAULT_PATH


def write_atomic(path: str, state: dict) -> None:
    """Write beside the file, then rename over it: a reader sees the old state or the
    new one, never half of one. Modes are set, not left to the umask (0644 in a 0755
    directory: readable by every local user, writable by the collector only)."""
    parent = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(parent):
        os.makedirs(parent, exist_ok=True)
        os.chmod(parent, 0o755)
    tmp = f"{path}.{os.getpid()}.tmp"
    fd = os.open(tmp, os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    try:
        os.fchmod(fd, 0o644)
        os.write(fd, json.dumps(state, separators=(",", ":"), sort_keys=True).encode())
    finally:
        os.close(fd)
    os.replace(tmp, path)


def read_state(path: str) -> dict:
    """The last state written. FileNotFoundError when there is none; ValueError when
    the file is not a state file."""
    with open(path, "rb") as f:
        state = json.loads(f.read())
    if not isinstance(state, dict) or not isinstance(state.get("pid"), int) or "written_at" not in state:
        raise ValueError("not an otel-gpu state file")
    return state
