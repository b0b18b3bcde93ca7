"""The no-blind-start scenario, shared by tests/bpf/test_first_requests.py and
bench/items/first_requests.py: a cuda_http.py server (optionally under a process name
of its own, what --exe matches) and requests sent the moment it listens, with no
wait for the collector to report it traced."""
from __future__ import annotations

import sys
import time
import urllib.error

from otel_gpu.demo.runner import free_port
from tests.harness import TARGETS, Target

# Runs cuda_http.py under a process name of its own (prctl PR_SET_NAME), so an --exe
# collector selects this server and no other Python process on the host.
NAMED = ("import ctypes, runpy, sys; ctypes.CDLL(None).prctl(15, sys.argv[1].encode(), 0, 0, 0);"
         "sys.argv = sys.argv[2:]; runpy.run_path(sys.argv[0], run_name='__main__')")


def start_server(kind: str, name: str = "", env: dict | None = None) -> Target:
    """Returns once it printed "listening on" (it serves after go)."""
    port = "0" if kind != "asgi" else str(free_port())
    script = [str(TARGETS / "cuda_http.py"), kind, port]
    argv = [sys.executable, "-c", NAMED, name, *script] if name else [sys.executable, *script]
    return Target(argv, env)


def send_first_requests(target: Target, paths, window_s: float = 20.0, go: bool = True) -> int:
    """Lets it serve (unless told already: go=False) and sends each path at once, one
    after the other, until the paths or `window_s` run out; returns how many were
    answered. A refused connection (uvicorn binds after "listening") is retried: it
    sent no request."""
    if go:
        target.go_raw()
    start, sent = time.monotonic(), 0
    for path in paths:
        while True:
            if time.monotonic() - start > window_s:
                return sent
            try:
                target.get(path)  # an error status raises
                sent += 1
                break
            except urllib.error.URLError as e:
                if not isinstance(e.reason, ConnectionRefusedError):
                    raise
                time.sleep(0.01)
    return sent
