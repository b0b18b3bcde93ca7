"""CLI edges: missing store, bad arguments, --since forms, default paths."""
import os
from datetime import datetime, timezone

import pytest

from otel_gpu.store.paths import default_store_path
from otel_gpu.store.since import parse_since
from store_helpers import run_cli

NOW = 1_700_000_000 * 10**9


def test_missing_store_is_one_clear_line(tmp_path, capsys):
    path = str(tmp_path / "nope.db")
    for cmd in ("report", "traces"):
        assert run_cli(cmd, "--db", path)[0] == 1
        err = capsys.readouterr().err
        assert err == f"otel-gpu: no local store at {path}: run `otel-gpu run` first (or --db)\n"
    assert not os.path.exists(path)  # reading never creates it


def test_db_defaults_to_env(tmp_path, monkeypatch, capsys):
    monkeypatch.setenv("OTEL_GPU_STORE", str(tmp_path / "env.db"))
    assert run_cli("report")[0] == 1
    assert str(tmp_path / "env.db") in capsys.readouterr().err


def test_not_a_store(tmp_path, capsys):
    bad = tmp_path / "bad.db"
    bad.write_text("not sqlite at all, " * 100)
    assert run_cli("report", "--db", str(bad))[0] == 1
    assert "cannot read store" in capsys.readouterr().err


def test_bad_arguments(store, db, capsys):
    assert run_cli("report", "--db", db, "--since", "yesterday")[0] == 2
    assert "15m" in capsys.readouterr().err
    assert run_cli("traces", "--db", db, "--slowest", "0")[0] == 2


@pytest.mark.parametrize("text,expect", [
    ("15m", NOW - 900 * 10**9), ("2h", NOW - 7200 * 10**9), ("1d", NOW - 86400 * 10**9),
    ("30s", NOW - 30 * 10**9), ("1.5h", NOW - 5400 * 10**9), ("1w", NOW - 7 * 86400 * 10**9),
    ("2023-11-14T22:00:00Z", int(datetime(2023, 11, 14, 22, tzinfo=timezone.utc).timestamp()) * 10**9),
    ("2023-11-14T23:00:00+01:00", int(datetime(2023, 11, 14, 22, tzinfo=timezone.utc).timestamp()) * 10**9),
    (None, None), ("", None),
])
def test_parse_since(text, expect):
    assert parse_since(text, now_ns=NOW) == expect


def test_parse_since_naive_is_local_time():
    local = datetime(2023, 11, 14, 22, 0).astimezone()
    assert parse_since("2023-11-14T22:00", now_ns=NOW) == int(local.timestamp()) * 10**9


@pytest.mark.parametrize("text", ["15", "m15", "2x", "last week"])
def test_parse_since_rejects(text):
    with pytest.raises(ValueError, match="duration"):
        parse_since(text, now_ns=NOW)


def test_default_path_env_wins(tmp_path):
    assert default_store_path({"OTEL_GPU_STORE": "/x/y.db"}, tmp_path) == "/x/y.db"


def test_default_path_system_dir_when_creatable(tmp_path):
    system = tmp_path / "var-lib" / "otel-gpu"
    assert default_store_path({}, system) == str(system / "otel-gpu.db")


def test_default_path_falls_back_to_state_dir(tmp_path, monkeypatch):
    blocker = tmp_path / "file"
    blocker.write_text("")  # /var/lib stand-in that cannot hold a directory
    env = {"XDG_STATE_HOME": str(tmp_path / "state"), "HOME": str(tmp_path / "home")}
    assert default_store_path(env, blocker / "otel-gpu") == str(tmp_path / "state" / "otel-gpu" / "otel-gpu.db")
    del env["XDG_STATE_HOME"]
    assert default_store_path(env, blocker / "otel-gpu") == str(
        tmp_path / "home" / ".local" / "state" / "otel-gpu" / "otel-gpu.db")
    monkeypatch.setattr(os, "access", lambda *a: False)  # a plain non-root user
    assert default_store_path(env, tmp_path / "ro") == str(
        tmp_path / "home" / ".local" / "state" / "otel-gpu" / "otel-gpu.db")


def test_default_path_existing_system_store_wins_for_readers(tmp_path, monkeypatch):
    system = tmp_path / "otel-gpu"
    system.mkdir()
    (system / "otel-gpu.db").write_text("")
    monkeypatch.setattr(os, "access", lambda *a: False)  # not writable: a user reading root's store
    assert default_store_path({"HOME": str(tmp_path)}, system) == str(system / "otel-gpu.db")
