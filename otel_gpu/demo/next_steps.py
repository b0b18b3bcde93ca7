"""The demo's closing lines: where its data is and the next three commands to try,
spelled so that they work when pasted (the CLI's path, `--db` when the store is not
the default one, `sudo` when the user who ran `sudo make demo` cannot read it)."""
from __future__ import annotations

import contextlib
import os
import pwd
import shlex
import shutil
import stat
import sys
from pathlib import Path
from typing import Mapping, Optional

from ..store.paths import DB_NAME, SYSTEM_DIR

# (arguments, what it shows); tests/unit/demo checks that each parses.
SUGGESTIONS = [
    (["report"], "GPU time, cost and latency per route"),
    (["traces", "--slowest", "3"], "the slowest requests; --trace-id ID draws one with its CUDA calls"),
    (["report", "--html", "report.html"], "one page of charts and waterfalls, for a browser"),
]


def cli_command(executable: str = sys.executable, cwd: Optional[str] = None) -> str:
    """How to call otel-gpu: the script installed beside this Python (relative to the
    current directory when under it, as `.venv/bin/otel-gpu`), else `python -m`."""
    script = Path(executable).parent / "otel-gpu"
    if not script.exists():
        return f"{shlex.quote(executable)} -m otel_gpu.cli"
    if shutil.which("otel-gpu") == str(script):
        return "otel-gpu"
    cwd = Path(cwd or os.getcwd())
    try:
        return str(script.relative_to(cwd))
    except ValueError:
        return str(script)


def readable_by(path: str, uid: int, gids: set[int]) -> bool:
    """Whether that user may read the file: r on it, x on every directory above it."""
    def allowed(p: Path, owner_bit: int, group_bit: int, other_bit: int) -> bool:
        st = p.stat()
        bit = owner_bit if st.st_uid == uid else group_bit if st.st_gid in gids else other_bit
        return bool(st.st_mode & bit)
    p = Path(path).resolve()
    try:
        return (all(allowed(d, stat.S_IXUSR, stat.S_IXGRP, stat.S_IXOTH) for d in p.parents)
                and allowed(p, stat.S_IRUSR, stat.S_IRGRP, stat.S_IROTH))
    except OSError:
        return False


def needs_sudo(store: str, env: Mapping[str, str], euid: int) -> bool:
    """Run as root through sudo, and the user who typed sudo cannot read the store."""
    if euid != 0 or not env.get("SUDO_UID", "").isdigit() or not os.path.exists(store):
        return False
    uid, gid = int(env["SUDO_UID"]), int(env.get("SUDO_GID", "-1") or -1)
    gids = {gid}
    with contextlib.suppress(KeyError, OSError):
        gids |= set(os.getgrouplist(pwd.getpwuid(uid).pw_name, gid))
    return not readable_by(store, uid, gids)


def next_steps(store: str, keep: bool, service: str, env: Optional[Mapping[str, str]] = None,
               euid: Optional[int] = None, cli: Optional[str] = None) -> str:
    env = os.environ if env is None else env
    euid = os.geteuid() if euid is None else euid
    sudo = needs_sudo(store, env, euid)
    prefix = ("sudo " if sudo else "") + (cli or cli_command())
    db = [] if store == str(SYSTEM_DIR / DB_NAME) else ["--db", store]
    commands = []
    for argv, what in SUGGESTIONS:
        commands.append((f"{prefix} {shlex.join(argv[:1] + db + argv[1:])}", what))
    width = max(len(c) for c, _ in commands)
    lines = ["", f"The demo's traces and costs are in the local store {store}",
             f"(service.name {service}; " + ("this run was added to the earlier demo runs)" if keep else
                                                     "the next demo replaces them; `demo --keep` adds to them)"),
             "Next, try:"]
    lines += [f"  {c:<{width}}  # {w}" for c, w in commands]
    if sudo:
        lines.append("(sudo: the store is readable by root only; `otel-gpu run --store-group GROUP` "
                     "lets a group read it)")
    return "\n".join(lines)
