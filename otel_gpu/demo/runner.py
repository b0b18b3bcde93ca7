"""`otel-gpu demo`: the collector plus the demo service, a handful of requests to
several routes, the trace trees on the console, then everything stops."""
from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request


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

    def wait_for(self, needle: str, timeout: float) -> bool:
        with self._cond:
            return self._cond.wait_for(lambda: any(needle in l for l in self.lines), timeout)


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


def wait_for_port(port: int, timeout: float) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            socket.create_connection(("127.0.0.1", port), timeout=0.5).close()
            return True
        except OSError:
            time.sleep(0.1)
    return False


def run_demo(requests_per_route: int = 3) -> int:
    py = sys.executable
    # A store of its own, so the closing report is about this run only.
    store = os.path.join(tempfile.mkdtemp(prefix="otel-gpu-demo-"), "demo.db")
    collector = subprocess.Popen([py, "-m", "otel_gpu.cli", "run", "--console", "--store", store,
                                  "--gpu-price", os.environ.get("OTEL_GPU_PRICE_PER_HOUR", "2.5")],
                                 stderr=subprocess.PIPE, text=True)
    port = free_port()
    service = None
    try:
        watcher = LineWatcher(collector.stderr)
        if not watcher.wait_for("ready", 60):
            print("demo: the collector did not become ready", file=sys.stderr)
            return 1
        env = dict(os.environ, OTEL_SERVICE_NAME="demo-inference")
        service = subprocess.Popen([py, "-m", "otel_gpu.demo.service", "--port", str(port)], env=env)
        if not wait_for_port(port, 30) or not watcher.wait_for(f"tracing pid {service.pid}", 30):
            print("demo: the service did not start or was not picked up", file=sys.stderr)
            return 1
        base = f"http://127.0.0.1:{port}"
        for i in range(requests_per_route):
            urllib.request.urlopen(f"{base}/infer/{100 + i}").read()
            urllib.request.urlopen(urllib.request.Request(f"{base}/embed", data=b"x" * (256 * (i + 1)))).read()
        urllib.request.urlopen(f"{base}/health").read()
        time.sleep(1.0)  # let the collector drain the ring buffer
    finally:
        if service:
            stop_process(service, timeout=10)
        stop_process(collector, signal.SIGINT)
    print("\nPer-route GPU cost of this run (host-side estimates; otel-gpu report --help):", flush=True)
    return subprocess.call([py, "-m", "otel_gpu.cli", "report", "--db", store])
