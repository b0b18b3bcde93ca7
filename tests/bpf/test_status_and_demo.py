"""`otel-gpu status` against a real collector, read by an unprivileged user; and the
real demo: its data stays in the store that `report`/`traces` read by default, and a
second run replaces the first (--keep adds to it)."""
from __future__ import annotations

import json
import os
import shlex
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import pytest

from tests.harness import ROOT, server_spans

NOBODY = ["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"]


@pytest.fixture
def open_dir():
    """A directory user nobody can reach (pytest's tmp_path sits under a 0700 one)."""
    d = Path(tempfile.mkdtemp(prefix="otel-gpu-status-", dir="/tmp"))
    os.chmod(d, 0o755)
    yield d
    shutil.rmtree(d)


def status_as_nobody(path: Path) -> tuple[int, dict, str]:
    done = subprocess.run(NOBODY + [sys.executable, "-m", "otel_gpu.cli", "status", "--json", "--file", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    return done.returncode, json.loads(done.stdout), done.stderr


def test_status_of_a_running_collector_without_root(open_dir, receiver, start_collector, start_target):
    path = open_dir / "run" / "status.json"  # the collector makes the directory
    target = start_target("stdlib")  # first, so the collector traces it alone: exact counts
    collector = start_collector("--pid", str(target.pid), OTEL_GPU_STATUS_FILE=str(path))
    collector.wait_traced(target.pid)
    target.go()
    n = 5
    for _ in range(n):
        target.get("/work?launches=2")
    assert receiver.wait_for(lambda spans: len(server_spans(spans, target.pid)) >= n + 1)  # + go()'s probe
    served = len(server_spans(receiver.spans, target.pid))

    def exported(doc) -> int:
        return sum(e.get("spans_exported", 0) for e in doc["state"]["exports"] if e["name"] == "otlp")

    deadline, doc = time.monotonic() + 30, None
    while time.monotonic() < deadline:  # rewritten every 2 s
        rc, doc, err = status_as_nobody(path)
        assert rc == 0, err
        # The receiver can hold the spans before the exporter's call returns and counts them.
        if doc["state"]["requests"]["finished"] >= served and exported(doc) >= served:
            break
        time.sleep(0.5)
    state = doc["state"]
    assert doc["running"] is True and doc["stale"] is None
    assert state["requests"]["finished"] == served
    assert {p["pid"]: p["role"] for p in state["processes"]["listed"]} == {target.pid: "cuda"}
    assert state["probes"]["attached"]["cudaLaunchKernel"] >= 1 and state["probes"]["failed"] == {}
    assert state["probes"]["tracepoints"] > 0
    [otlp] = [e for e in state["exports"] if e["name"] == "otlp"]
    assert otlp["state"] == "ok" and otlp["spans_exported"] >= served
    assert state["pid"] == collector.proc.pid
    assert oct(path.stat().st_mode & 0o777) == "0o644" and oct(path.parent.stat().st_mode & 0o777) == "0o755"

    text = subprocess.run(NOBODY + [sys.executable, "-m", "otel_gpu.cli", "status", "--file", str(path)],
                          capture_output=True, text=True, cwd=ROOT, timeout=60)
    assert text.returncode == 0 and f"{target.pid}  " in text.stdout and "cudaLaunchKernel" in text.stdout

    assert collector.stop() == 0
    rc, doc, _ = status_as_nobody(path)  # its final state, kept: the counts the `stopped:` line logs
    assert rc == 1 and doc["running"] is False and "stopped at" in doc["stale"]
    assert doc["state"]["requests"]["finished"] == served and doc["state"]["spans"] >= served


def run_demo(env: dict, *flags: str) -> str:
    done = subprocess.run([sys.executable, "-m", "otel_gpu.cli", "demo", "--requests", "2", *flags],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=240)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def demo_rows(env: dict) -> dict:
    """report as a user runs it after the demo: no --db, the store found by default."""
    done = subprocess.run([sys.executable, "-m", "otel_gpu.cli", "report", "--format", "json"],
                          capture_output=True, text=True, cwd=ROOT, env=env, timeout=60)
    assert done.returncode == 0, done.stderr
    return {r["feature"]: r["requests"] for r in json.loads(done.stdout)["rows"]
            if r["service"] == "demo-inference" and r["feature"]}


def test_demo_leaves_its_data_for_report_and_traces(open_dir):
    store = str(open_dir / "store" / "otel-gpu.db")
    env = {**os.environ, "OTEL_GPU_STORE": store, "OTEL_GPU_STATUS_FILE": str(open_dir / "status.json")}
    env.pop("OTEL_EXPORTER_OTLP_ENDPOINT", None)
    out = run_demo({**env, "SUDO_UID": "65534", "SUDO_GID": "65534"})  # as `sudo make demo` by nobody
    assert f"local store {store}" in out
    nxt = out[out.index("Next, try:"):].splitlines()[1:]
    commands = [shlex.split(line.split("  # ")[0]) for line in nxt if line.startswith("  ")]
    assert len(commands) == 3
    assert demo_rows(env) == {"/infer/{id}": 2, "/embed": 2, "/health": 1}

    for argv in commands:  # the closing lines, pasted as they are (the HTML one would write into the repo)
        if "--html" in argv:
            continue
        sudo = argv[0] == "sudo"  # said exactly when nobody cannot read the store
        argv = argv[1:] if sudo else argv
        as_nobody = subprocess.run(NOBODY + argv, capture_output=True, text=True, cwd=ROOT, timeout=60)
        assert (as_nobody.returncode != 0) is sudo, (argv, as_nobody.stderr)
        done = subprocess.run(argv, capture_output=True, text=True, cwd=ROOT, timeout=60)  # as root
        assert done.returncode == 0, (argv, done.stderr)
        if "--slowest" in argv:  # any 3 of the 5: latency decides which
            assert sum(r in line for line in done.stdout.splitlines()
                       for r in ("GET /infer/{id}", "POST /embed", "GET /health")) == 3
        else:
            assert "/infer/{id}" in done.stdout and "/embed" in done.stdout
    listing = subprocess.run([sys.executable, "-m", "otel_gpu.cli", "traces", "--route", "/infer/{id}"],
                             capture_output=True, text=True, cwd=ROOT, env=env, timeout=60).stdout
    assert listing.count("GET /infer/{id}") == 2

    run_demo(env)  # a second run replaces the first
    assert demo_rows(env) == {"/infer/{id}": 2, "/embed": 2, "/health": 1}
    run_demo(env, "--keep")  # unless asked
    assert demo_rows(env) == {"/infer/{id}": 4, "/embed": 4, "/health": 2}
