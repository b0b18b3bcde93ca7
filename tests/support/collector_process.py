"""The collector as a subprocess, for the tests and the bench alike: `otel-gpu run
--no-console` started with the caller's flags and environment, its stderr watched
(`ready`, `tracing pid N`), its CPU and RSS read from /proc, and, once stopped, the
run's counts read from the final state it leaves in its status file
(otel_gpu/status/writer.py StatusWriter.final), never parsed from log lines."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from otel_gpu.demo.runner import LineWatcher, stop_process
from otel_gpu.pipeline.model import ATTRIBUTIONS
from otel_gpu.ratelimit import split_drops
from otel_gpu.status.file import read_state

ROOT = Path(__file__).resolve().parents[2]
TICK = os.sysconf("SC_CLK_TCK")
LOADED_RE = re.compile(r"BPF program loaded \(([\d.]+) s")


def cpu_seconds(pid: int) -> float:
    """utime + stime of every thread of the process."""
    with open(f"/proc/{pid}/stat") as f:
        fields = f.read().rsplit(")", 1)[1].split()
    return (int(fields[11]) + int(fields[12])) / TICK


def rss_mb(pid: int) -> float:
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1]) / 1024
    return 0.0


class CollectorProcess:
    def __init__(self, args=(), env: dict | None = None, ready_timeout: float = 180) -> None:
        """env: variables over this process's own; a None value unsets one. The status file
        is a fresh one of its own unless env names OTEL_GPU_STATUS_FILE."""
        merged = {**os.environ, **(env or {})}
        if not (env or {}).get("OTEL_GPU_STATUS_FILE"):
            self._status_dir = tempfile.TemporaryDirectory(prefix="otel-gpu-status-")
            merged["OTEL_GPU_STATUS_FILE"] = os.path.join(self._status_dir.name, "status.json")
        self.status_file = merged["OTEL_GPU_STATUS_FILE"]
        t0 = time.monotonic()
        self.proc = subprocess.Popen([sys.executable, "-m", "otel_gpu.cli", "run", "--no-console", *args],
                                     stderr=subprocess.PIPE, text=True, cwd=ROOT,
                                     env={k: v for k, v in merged.items() if v is not None})
        self.pid = self.proc.pid
        self.log = LineWatcher(self.proc.stderr, echo=None)
        self.stop_s: float | None = None
        if not self.log.wait_for("ready", ready_timeout):
            self.stop()
            raise RuntimeError("collector not ready:\n" + "".join(self.log.lines))
        self.ready_s = time.monotonic() - t0
        loaded = [m for m in (LOADED_RE.search(l) for l in self.log.lines) if m]
        self.load_s = float(loaded[0].group(1)) if loaded else None  # of ready_s: clang + verifier

    def wait_traced(self, pid: int, timeout: float = 60) -> None:  # a deadline, not a wait: loaded machines
        if not self.log.wait_for(f"tracing pid {pid}", timeout):
            raise RuntimeError(f"pid {pid} never traced:\n" + "".join(self.log.lines))

    def wait_device_clock(self, pid: int, timeout: float = 60) -> None:
        """Until the collector has seen pid's device-clock library: the calls it streams
        before that have no timeline to tie their records to (pipeline/device_times.py)."""
        from otel_gpu.pipeline.device_times import device_mode_line
        if not self.log.wait_for(device_mode_line(pid), timeout):
            raise RuntimeError(f"pid {pid} never seen in device-clock mode:\n" + "".join(self.log.lines))

    def until_at_driver(self, pid: int, timeout: float, step) -> bool:
        """step() (a warm-up launch or request) until the log says pid's runtime launches
        are counted at the driver alone (probes/launch_routes.py), `timeout` s at most;
        whether it got there."""
        from otel_gpu.probes.launch_routes import at_driver_line
        deadline, line = time.monotonic() + timeout, at_driver_line(pid)
        while not self.log.wait_for(line, 0.2):
            if time.monotonic() > deadline:
                return False
            step()
        return True

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def stop(self, sig: int = signal.SIGTERM, timeout: float = 60) -> int:
        """Signals it and waits; its exit status. A second call returns at once."""
        t0 = time.monotonic()
        rc = stop_process(self.proc, sig, timeout)
        if self.stop_s is None:
            self.stop_s = time.monotonic() - t0
        return rc

    def final_state(self) -> dict:
        """The state it left when it stopped (stopped_at set), or {} when it left none."""
        try:
            state = read_state(self.status_file)
        except (OSError, ValueError):
            return {}
        return state if state.get("pid") == self.pid and state.get("stopped_at") else {}

    def counts(self, timeout: float = 5) -> dict:
        """The run's counts from the final state (what the `stopped:` line logs): requests,
        spans, CUDA calls by attribution (each outcome's name), `dropped` and `counted`
        (each by counter), and cuda_calls_seen (every call attributed); {} when it left no
        final state (killed, or not stopped within `timeout`)."""
        deadline = time.monotonic() + timeout
        while not (state := self.final_state()) and self.proc.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if not state:
            return {}
        attributed = state.get("attribution", {})
        dropped, counted = split_drops(state.get("counters", {}))
        return {"requests": state["requests"]["finished"], "spans": state.get("spans", 0), **attributed,
                "dropped": dropped, "counted": counted,
                "cuda_calls_seen": sum(attributed.get(k, 0) for k in ATTRIBUTIONS)}

    def errors(self) -> list[str]:
        return [l.strip() for l in self.log.lines if " ERROR " in l or "Traceback" in l]
