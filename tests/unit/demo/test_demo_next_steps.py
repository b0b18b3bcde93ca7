"""The demo's closing lines (commands that parse, --db, sudo when the invoking user
cannot read the store) and how a new demo run replaces only the earlier demo's rows."""
from __future__ import annotations

import os
import shlex
import shutil
import sqlite3
import tempfile
from pathlib import Path

import pytest

from otel_gpu.cli import build_parser
from otel_gpu.demo.next_steps import needs_sudo, next_steps, readable_by
from otel_gpu.demo.runner import forget_earlier_runs
from otel_gpu.store.exporter import StoreExporter
from tests.unit.store.store_helpers import T0, request, window

CLI = ".venv/bin/otel-gpu"


def commands(text: str) -> list[list[str]]:
    return [shlex.split(line.split("#")[0]) for line in text.splitlines() if line.startswith(f"  {CLI}")
            or line.startswith(f"  sudo {CLI}")]


def test_three_commands_that_the_cli_accepts():
    text = next_steps("/var/lib/otel-gpu/otel-gpu.db", False, "demo-inference", env={}, euid=0, cli=CLI)
    cmds = commands(text)
    assert len(cmds) == 3
    assert [c[1] for c in cmds] == ["report", "traces", "report"]
    for c in cmds:
        build_parser().parse_args(c[1:])  # exits (a test failure) on a flag that does not exist
        assert "--db" not in c  # the default store: report/traces find it themselves
    assert "local store /var/lib/otel-gpu/otel-gpu.db" in text and "demo --keep" in text


def test_another_store_is_named_in_every_command(tmp_path):
    store = str(tmp_path / "d.db")
    cmds = commands(next_steps(store, True, "demo-inference", env={}, euid=0, cli=CLI))
    assert all(c[2:4] == ["--db", store] for c in cmds)


@pytest.fixture
def open_dir():
    """A directory every user can reach (pytest's tmp_path sits under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix="otel-gpu-test-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


def test_readable_by_follows_the_mode_bits(open_dir):
    d = open_dir / "dir"
    d.mkdir()
    f = d / "otel-gpu.db"
    f.write_text("")
    other = os.getuid() + 12345  # neither the owner nor in the group
    for dmode, fmode, expected in [(0o755, 0o644, True), (0o755, 0o600, False), (0o700, 0o644, False),
                                   (0o711, 0o644, True)]:
        os.chmod(d, dmode)
        os.chmod(f, fmode)
        assert readable_by(str(f), other, set()) is expected, (oct(dmode), oct(fmode))
    os.chmod(f, 0o640)
    assert readable_by(str(f), other, {f.stat().st_gid}) is True  # a --store-group member
    assert readable_by(str(f), os.getuid(), set()) is True  # the owner


def test_sudo_only_when_the_invoking_user_cannot_read(open_dir):
    f = open_dir / "otel-gpu.db"
    f.write_text("")
    os.chmod(f, 0o600)
    other = {"SUDO_UID": str(os.getuid() + 12345), "SUDO_GID": str(os.getgid() + 12345)}
    assert needs_sudo(str(f), other, euid=0)
    assert not needs_sudo(str(f), {}, euid=0)  # root without sudo: it reads it
    assert not needs_sudo(str(f), other, euid=1000)  # not root: the demo's user wrote it
    text = next_steps(str(f), False, "demo-inference", env=other, euid=0, cli=CLI)
    assert len(commands(text)) == 3 and all(l.startswith(f"  sudo {CLI}") for l in text.splitlines()
                                            if CLI in l and l.startswith("  "))
    os.chmod(f, 0o644)
    assert not needs_sudo(str(f), other, euid=0)


@pytest.fixture
def store_with_two_services(tmp_path):
    path = str(tmp_path / "otel-gpu.db")
    s = StoreExporter(path, now_ns=lambda: T0 + 10**9)
    s.export(request(1, T0, 10**6, service="demo-inference"))
    s.export(request(2, T0 + 10**6, 10**6, service="demo-inference"))
    s.export(window(3, T0, service="demo-inference", gpu_seconds=0.1, cost=0.0))
    s.export(request(4, T0, 10**6, service="payments"))
    s.shutdown()
    return path


def counts(path: str) -> dict:
    conn = sqlite3.connect(path)
    try:
        return {t: dict(conn.execute(f"SELECT service, count(*) FROM {t} GROUP BY service").fetchall())
                for t in ("requests", "spans", "window_costs")}
    finally:
        conn.close()


def test_forget_earlier_runs_removes_only_the_demo(store_with_two_services):
    before = counts(store_with_two_services)
    assert before["requests"] == {"demo-inference": 2, "payments": 1} and before["window_costs"]["demo-inference"]
    gone = forget_earlier_runs(store_with_two_services)
    after = counts(store_with_two_services)
    assert after == {"requests": {"payments": 1}, "spans": {"payments": before["spans"]["payments"]},
                     "window_costs": {}}
    assert gone == 2 + before["spans"]["demo-inference"] + before["window_costs"]["demo-inference"]


def test_forget_earlier_runs_without_a_store(tmp_path):
    assert forget_earlier_runs(str(tmp_path / "none.db")) == 0
    assert not (tmp_path / "none.db").exists()
