"""Where the local store lives when --db / OTEL_GPU_STORE do not say."""
from __future__ import annotations

import os
from pathlib import Path
from typing import Mapping, Optional

SYSTEM_DIR = Path("/var/lib/otel-gpu")
DB_NAME = "otel-gpu.db"


def _writable_dir(d: Path) -> bool:
    """True when d exists and is writable, or could be created."""
    while not d.exists():
        if d.parent == d:
            return False
        d = d.parent
    return d.is_dir() and os.access(d, os.W_OK | os.X_OK)


def user_state_dir(env: Mapping[str, str]) -> Path:
    base = env.get("XDG_STATE_HOME") or os.path.join(env.get("HOME") or os.path.expanduser("~"),
                                                      ".local", "state")
    return Path(base) / "otel-gpu"


def default_store_path(env: Optional[Mapping[str, str]] = None, system_dir: Path = SYSTEM_DIR) -> str:
    """OTEL_GPU_STORE, else /var/lib/otel-gpu/otel-gpu.db, else the user's state dir.

    An existing system store wins even when it is not writable: the collector runs as
    root and writes it, while `report`/`traces` run as any user and only read it."""
    env = os.environ if env is None else env
    if env.get("OTEL_GPU_STORE"):
        return env["OTEL_GPU_STORE"]
    system = system_dir / DB_NAME
    if system.exists() or _writable_dir(system_dir):
        return str(system)
    return str(user_state_dir(env) / DB_NAME)
