"""bench/http_service.py as a subprocess on 127.0.0.1, and the load generator
(bench/load.py) as another, so neither shares a GIL with this process."""
from __future__ import annotations

import json
import os
import subprocess
import sys
import urllib.request

from otel_gpu.demo.runner import LineWatcher, stop_process

from .cpus import on as cpus_on
from .isolate import OwnCgroup


class Service:
    def __init__(self, args: tuple = (), argv: list | None = None, env: dict | None = None) -> None:
        """argv: another service that prints 'listening on PORT' (default: bench.http_service + args);
        env: added to this process's environment."""
        self.tls = "--tls" in args
        self.cgroup = OwnCgroup()  # the bench process is not a related server of it (isolate.py)
        argv = argv or [sys.executable, "-m", "bench.http_service", *args]
        self.proc = subprocess.Popen(self.cgroup.wrap(argv), stdin=subprocess.DEVNULL, stderr=subprocess.PIPE,
                                     text=True, env={**os.environ, **(env or {})})
        self.pid = self.proc.pid
        log = LineWatcher(self.proc.stderr, echo=None)
        if not log.wait_for("listening on", 30):
            self.stop()
            raise RuntimeError("bench service did not start:\n" + "".join(log.lines))
        self.port = int(next(l for l in log.lines if "listening on" in l).split()[2])

    def get(self, path: str) -> int:
        with urllib.request.urlopen(f"http://127.0.0.1:{self.port}{path}", timeout=60) as r:
            r.read()
            return r.status

    def load(self, seconds: float, conns: int = 4, max_requests: int = 500_000, path: str = "/work",
             times: bool = False, cpus: set[int] | None = None) -> dict:
        """bench/load.py's result; times: with each request's completion time (done_at);
        cpus: where the load generator runs (bench/cpus.py; None: anywhere)."""
        out = subprocess.run([sys.executable, "-m", "bench.load", "--port", str(self.port), "--path", path,
                              "--conns", str(conns), "--seconds", str(seconds), "--max", str(max_requests)]
                             + (["--tls"] if self.tls else []) + (["--times"] if times else []),
                             capture_output=True, text=True, timeout=seconds + 120, check=True,
                             preexec_fn=cpus_on(cpus))
        return json.loads(out.stdout)

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)
        self.cgroup.remove()
