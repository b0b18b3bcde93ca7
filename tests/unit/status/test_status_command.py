"""`otel-gpu status`: running, not running, stopped (its final state), stale (pid gone,
pid reused, not rewritten), text and JSON, through the real command line."""
from __future__ import annotations

import io
import json
import os
import subprocess
import sys
import time

import pytest

from otel_gpu import proc
from otel_gpu.cli import build_parser
from otel_gpu.status import command
from otel_gpu.status.file import write_atomic


def state(pid: int, written_at: float, **extra) -> dict:
    return {"schema": 1, "version": "9.9", "pid": pid, "pid_start_ticks": proc.start_time("/proc", pid),
            "started_at": written_at - 75, "written_at": written_at, "uptime_s": 75, "interval_s": 2.0,
            "processes": {"count": 1, "listed": [{"pid": 4242, "name": "uvicorn", "role": "cuda"}]},
            "probes": {"tracepoints": 22, "files": 1, "attached": {"cudaLaunchKernel": 1},
                       "failed": {"cudaMalloc": 1}, "single_stepped": {"SSL_free": ["/lib/libssl.so.3"]},
                       "launch_routes": {"at_driver": 3, "at_runtime": 1}},
            "kernel_maps": {"mb": 45.7, "cpus": 2, "node_cpus": 224, "node_mb": 54.2, "node_full_mb": 86.7,
                            "largest": {"events": 8.4}},
            "requests": {"finished": 1234, "per_second": 12.5},
            "attribution": {"thread": 40},
            "counters": {"requests_finished": 1234, "http_parse_errors": 3, "spans_exported": 9},
            "exports": [{"name": "otlp", "state": "failing", "failing_since": written_at - 45,
                         "spans_exported": 9, "spans_failed": 4, "pending": 2}], **extra}


def status(path: str, *flags: str, now: float | None = None) -> tuple[int, str]:
    out = io.StringIO()
    rc = command.run(build_parser().parse_args(["status", "--file", path, *flags]), out, now=now)
    return rc, out.getvalue()


def test_running_collector_text(tmp_path):
    path = str(tmp_path / "status.json")
    now = time.time()
    write_atomic(path, state(os.getpid(), now - 1))
    rc, text = status(path, now=now)
    assert rc == 0 and "STALE" not in text
    assert f"otel-gpu 9.9, pid {os.getpid()}, up 1m15s" in text
    assert "4242  uvicorn" in text
    assert "cudaLaunchKernel 1" in text and "FAILED to attach: cudaMalloc 1" in text
    assert "single-stepped by x86 (~10 us a call on VMs" in text and text.rstrip().count("SSL_free") == 1
    assert "runtime launches of 3 processes counted at the driver alone (one probe a launch), of 1 at the " \
           "runtime's probe" in text
    assert "kernel memory (BPF maps): 45.7 MB on 2 CPUs; at 224 CPUs 54.2 MB, 86.7 MB with every table" in text
    assert "requests: 1234 finished, 12.5/s" in text
    assert "drops and errors (counters): http_parse_errors 3" in text  # work counters are not drops
    assert "otlp     FAILING since" in text and "(46s): pending 2" in text and "spans failed 4" in text


def test_running_collector_json(tmp_path):
    path = str(tmp_path / "status.json")
    now = time.time()
    write_atomic(path, state(os.getpid(), now))
    rc, text = status(path, "--json", now=now)
    doc = json.loads(text)
    assert rc == 0 and doc["running"] is True and doc["stale"] is None
    assert doc["state"]["requests"]["finished"] == 1234 and doc["path"] == path


def test_no_state_file(tmp_path, capsys):
    rc, _ = status(str(tmp_path / "none.json"))
    assert rc == 1 and "no collector is running: no state file at" in capsys.readouterr().err
    rc, text = status(str(tmp_path / "none.json"), "--json")
    assert rc == 1 and json.loads(text)["running"] is False


def test_not_a_state_file(tmp_path, capsys):
    path = tmp_path / "status.json"
    path.write_text("{half")
    assert status(str(path))[0] == 1
    assert "cannot read the state file" in capsys.readouterr().err


def test_stale_when_the_pid_is_gone(tmp_path):
    child = subprocess.Popen([sys.executable, "-c", "pass"])
    child.wait()
    path = str(tmp_path / "status.json")
    now = time.time()
    write_atomic(path, state(child.pid, now))
    rc, text = status(path, now=now)
    assert rc == 1 and text.startswith(f"STALE: collector pid {child.pid} is gone")
    assert "requests: 1234 finished" in text  # the last state is still shown


def test_a_stopped_collector_shows_its_final_state(tmp_path):
    path = str(tmp_path / "status.json")
    now = time.time()
    write_atomic(path, state(os.getpid(), now, stopped_at=now - 3, spans=5000))  # its pid may live on
    rc, text = status(path, now=now)
    assert rc == 1 and text.startswith(f"STOPPED: collector pid {os.getpid()} stopped at ")
    assert "requests: 1234 finished" in text and "spans: 5000" in text
    rc, text = status(path, "--json", now=now)
    doc = json.loads(text)
    assert rc == 1 and doc["running"] is False and "stopped at" in doc["stale"]


def test_stale_when_the_pid_is_another_process(tmp_path):
    path = str(tmp_path / "status.json")
    now = time.time()
    s = state(os.getpid(), now)
    s["pid_start_ticks"] += 1
    write_atomic(path, s)
    rc, text = status(path, "--json", now=now)
    assert rc == 1 and "now another process" in json.loads(text)["stale"]


@pytest.mark.parametrize("age,stale", [(9.0, False), (11.0, True)])
def test_stale_after_five_intervals(tmp_path, age, stale):
    path = str(tmp_path / "status.json")
    now = time.time()
    write_atomic(path, state(os.getpid(), now - age))
    rc, text = status(path, now=now)
    assert (rc == 1) is stale and ("the collector is stuck" in text) is stale


def test_environment_names_the_file(tmp_path):
    path = str(tmp_path / "elsewhere.json")
    write_atomic(path, state(os.getpid(), time.time()))
    done = subprocess.run([sys.executable, "-m", "otel_gpu.cli", "status", "--json"], capture_output=True,
                          text=True, env={**os.environ, "OTEL_GPU_STATUS_FILE": path}, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["path"] == path
