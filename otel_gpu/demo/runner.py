"""`otel-gpu demo`: the collector plus the demo service, a handful of requests to
several routes, the trace trees on the console, then everything stops."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import sqlite3
import threading
import time
import urllib.request

from ..store.paths import default_store_path
from .next_steps import next_steps


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class LineWatcher:
    """Echoes a stream's lines and lets callers wait for one that contains a string."""

    def __init__(self, stream, echo=sys.stderr) -> None:
        self.lines: list[str] = []
        self._cond = threading.Condition()
        self._echo = echo
        threading.Thread(target=self._pump, args=(stream,), daemon=True).start()

    def _pump(self, stream) -> None:
        for line in iter(stream.readline, ""):
            if self._echo:
                self._echo.write(line)
            with self._cond:
                self.lines.append(line)
                self._cond.notify_all()

    def wait_for(self, needle: str, timeout: float, count: int = 1) -> bool:
        """Until `count` lines contain `needle`."""
        with self._cond:
            return self._cond.wait_for(lambda: sum(needle in l for l in self.lines) >= count, timeout)


def stop_process(proc: subprocess.Popen, sig: int = signal.SIGTERM, timeout: float = 30) -> int:
    """Signal, wait, kill if it will not stop; the exit code."""
    if proc.poll() is None:
        proc.send_signal(sig)
        try:
            proc.wait(timeout)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
    return proc.returncode


def interrupt_until(proc: subprocess.Popen, answered, tries: int = 3, wait_s: float = 10.0) -> bool:
    """Sends SIGINT until `answered(wait_s)` is true, `tries` times at most. bpftrace
    0.17 sometimes sleeps on in its event loop after a SIGINT and neither prints its
    maps nor exits (seen in the bench and in CI); a second SIGINT has ended it at once."""
    for _ in range(tries):
        if proc.poll() is None:
            proc.send_signal(signal.SIGINT)
        if answered(wait_s):
            return True
    return False


def wait_for_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


DEMO_SERVICE = "demo-inference"  # the demo service's service.name: its rows in the store


def forget_earlier_runs(store: str, service: str = DEMO_SERVICE) -> int:
    """Deletes the rows an earlier demo left in the store, so that this run's report is
    about this run; other services' rows stay. Every table with a `service` column
    (store/schema.py), so a table added later is covered too. Rows deleted."""
    if not os.path.exists(store):
        return 0
    conn = sqlite3.connect(store, timeout=10, isolation_level=None)
    try:
        tables = [name for (name,) in conn.execute("SELECT name FROM sqlite_master WHERE type = 'table'")
                  if any(col[1] == "service" for col in conn.execute(f'PRAGMA table_info("{name}")'))]
        conn.execute("BEGIN IMMEDIATE")
        gone = sum(conn.execute(f'DELETE FROM "{t}" WHERE service = ?', (service,)).rowcount for t in tables)
        conn.execute("COMMIT")
        return gone
    finally:
        conn.close()


def run_demo(requests_per_route: int = 3, keep: bool = False) -> int:
    """The demo service, then a collector tracing only it (other CUDA processes on the
    host stay out of the demo's data), a few requests, a report. The spans stay in the
    default local store, where `otel-gpu report` and `otel-gpu traces` look."""
    py = sys.executable
    store = default_store_path()
    if not keep:
        try:
            forget_earlier_runs(store)
        except sqlite3.Error as e:
            print(f"demo: could not remove the earlier demo runs from {store} ({e}): "
                  "the report will count them too", file=sys.stderr)
    port = free_port()
    env = dict(os.environ, OTEL_SERVICE_NAME=DEMO_SERVICE)
    # Started first, so that the collector can be told to trace it alone (--pid).
    service = subprocess.Popen([py, "-m", "otel_gpu.demo.service", "--port", str(port)], env=env)
    collector = None
    try:
        if not wait_for_port(port, 30):
            print("demo: the service did not start", file=sys.stderr)
            return 1
        collector = subprocess.Popen([py, "-m", "otel_gpu.cli", "run", "--console", "--store", store,
                                      "--pid", str(service.pid),
                                      "--gpu-price", os.environ.get("OTEL_GPU_PRICE_PER_HOUR", "2.5")],
                                     stderr=subprocess.PIPE, text=True)
        watcher = LineWatcher(collector.stderr)
        if not watcher.wait_for("ready", 60) or not watcher.wait_for(f"tracing pid {service.pid}", 30):
            print("demo: the collector did not become ready or did not pick up the service", file=sys.stderr)
            return 1
        base = f"http://127.0.0.1:{port}"
        for i in range(requests_per_route):
            urllib.request.urlopen(f"{base}/infer/{100 + i}").read()
            urllib.request.urlopen(urllib.request.Request(f"{base}/embed", data=b"x" * (256 * (i + 1)))).read()
        urllib.request.urlopen(f"{base}/health").read()
        time.sleep(1.0)  # let the collector drain the ring buffer
    finally:
        stop_process(service, timeout=10)
        if collector is not None:
            stop_process(collector, signal.SIGINT)
    print(f"\nPer-route GPU cost of the demo{' runs' if keep else ''} (host-side estimates; otel-gpu report --help):",
          flush=True)
    rc = subprocess.call([py, "-m", "otel_gpu.cli", "report", "--db", store, "--service", DEMO_SERVICE])
    print(next_steps(store, keep, DEMO_SERVICE), flush=True)
    return rc
