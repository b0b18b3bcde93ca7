"""The otel-gpu collector as a subprocess: time to `ready`, CPU and RSS from /proc,
its `stopped:` summary and ring-buffer warnings."""
from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

from otel_gpu.demo.runner import LineWatcher, stop_process

ROOT = Path(__file__).resolve().parents[1]
TICK = os.sysconf("SC_CLK_TCK")
LOADED_RE = re.compile(r"BPF program loaded \(([\d.]+) s")
STOPPED_RE = re.compile(r"stopped: (\d+) requests, (\d+) spans; CUDA calls by attribution: "
                        r"((?:\w+=\d+ ?)+); dropped: (.*); counted: (.*)$")


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


class Collector:
    loads: list = []  # load_s of every collector this run started (item 4's split of `ready`)

    def __init__(self, otlp_endpoint: str | None = None, args: tuple = (), env: dict | None = None) -> None:
        """env: variables for the collector over the bench's own; a None value unsets one."""
        base = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
        if otlp_endpoint:
            base.update(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_endpoint, OTEL_BSP_SCHEDULE_DELAY="200")
        base.update(env or {})
        env = {k: v for k, v in base.items() if v is not None}
        t0 = time.monotonic()
        # --no-store first (an item's own --store wins): the bench's targets stay out of the user's store.
        self.proc = subprocess.Popen([sys.executable, "-m", "otel_gpu.cli", "run", "--no-console", "--no-store", *args],
                                     stderr=subprocess.PIPE, text=True, env=env, cwd=ROOT)
        self.pid = self.proc.pid
        self.log = LineWatcher(self.proc.stderr, echo=None)
        if not self.log.wait_for("ready", 90):
            self.stop()
            raise RuntimeError("collector not ready:\n" + "".join(self.log.lines))
        self.ready_s = time.monotonic() - t0
        loaded = [m for m in (LOADED_RE.search(l) for l in self.log.lines) if m]
        self.load_s = float(loaded[0].group(1)) if loaded else None  # of ready_s: clang + verifier
        if self.load_s is not None:
            Collector.loads.append(self.load_s)
        self.stop_s = None

    def wait_traced(self, pid: int, timeout: float = 30) -> None:
        if not self.log.wait_for(f"tracing pid {pid}", timeout):
            raise RuntimeError(f"pid {pid} never traced:\n" + "".join(self.log.lines))

    def cpu_seconds(self) -> float:
        return cpu_seconds(self.pid)

    def rss_mb(self) -> float:
        return rss_mb(self.pid)

    def stop(self) -> dict:
        """SIGINT, wait, and the parsed `stopped:` line (empty dict if none)."""
        t0 = time.monotonic()
        stop_process(self.proc, signal.SIGINT, 60)
        self.stop_s = time.monotonic() - t0
        time.sleep(0.2)  # let the watcher read the last lines
        return self.summary()

    def summary(self) -> dict:
        out = {"ringbuf_full_warnings": sum("ring buffer full" in l for l in self.log.lines)}
        for line in self.log.lines:
            m = STOPPED_RE.search(line.strip())
            if m:
                out.update(requests=int(m.group(1)), spans=int(m.group(2)))
                out.update((k, int(v)) for k, v in (kv.split("=") for kv in m.group(3).split()))
                for key, pairs in (("dropped", m.group(4)), ("counted", m.group(5))):
                    out[key] = {k: int(v) for k, v in (kv.split("=") for kv in pairs.split(", ") if "=" in kv)}
        out["cuda_calls_seen"] = sum(out.get(k, 0) for k in ("task", "thread", "process", "ambiguous", "shared",
                                                            "outside"))
        return out

    @staticmethod
    def lost_events(summary: dict):
        """Records the kernel could not hand over (`lost_events`, counted only once
        non-zero), or None when no `stopped:` line was read: never a made-up 0."""
        return summary["dropped"].get("lost_events", 0) if "dropped" in summary else None

    def errors(self) -> list[str]:
        return [l.strip() for l in self.log.lines if " ERROR " in l or "Traceback" in l]


def known(value, missing: str = "no `stopped:` line read") -> str:
    """A figure for the table, or why it is not known."""
    return f"not known ({missing})" if value is None else str(value)
