"""Concurrent HTTP clients for the bpf tier: `concurrency` threads, each with its own
keep-alive http.client connection to 127.0.0.1, taking paths from one shared list
until it is empty or the deadline passes (bounded in count and time)."""
from __future__ import annotations

import http.client
import threading
import time
from dataclasses import dataclass, field


@dataclass
class Outcome:
    status: dict = field(default_factory=dict)   # path -> HTTP status (or -1: transport error)
    body: dict = field(default_factory=dict)     # path -> response body
    errors: list = field(default_factory=list)   # (path, repr(exception))
    connections: int = 0                         # TCP connections opened
    seconds: float = 0.0

    @property
    def ok(self) -> list[str]:
        return [p for p, s in self.status.items() if s == 200]


def fetch_all(port: int, paths: list[str], concurrency: int, seconds: float = 60.0,
              timeout: float = 20.0, tls=None, headers=None) -> Outcome:
    """`tls`: an ssl.SSLContext, for HTTPS; `headers`: path -> its request's headers."""
    out, lock = Outcome(), threading.Lock()
    todo = list(reversed(paths))
    deadline = time.monotonic() + seconds
    start = threading.Barrier(concurrency)  # every client connected before the first request

    def client() -> None:
        conn = _connection(port, timeout, tls)
        opened = 0
        try:
            conn.connect()
            opened += 1
        except OSError:
            pass
        try:
            start.wait(timeout)
        except threading.BrokenBarrierError:
            pass
        while time.monotonic() < deadline:
            with lock:
                if not todo:
                    break
                path = todo.pop()
            try:
                conn.request("GET", path, headers=headers(path) if headers else {})
                resp = conn.getresponse()
                data = resp.read()  # chunked bodies too
                status = resp.status
            except (OSError, http.client.HTTPException) as e:
                status, data = -1, b""
                with lock:
                    out.errors.append((path, repr(e)))
                conn.close()
                conn = _connection(port, timeout, tls)
                opened += 1
            with lock:
                out.status[path], out.body[path] = status, data
        conn.close()
        with lock:
            out.connections += opened

    t0 = time.monotonic()
    threads = [threading.Thread(target=client, daemon=True) for _ in range(concurrency)]
    for t in threads:
        t.start()
    for t in threads:
        t.join(seconds + timeout + 5)
    out.seconds = time.monotonic() - t0
    return out


def _connection(port: int, timeout: float, tls) -> http.client.HTTPConnection:
    if tls is None:
        return http.client.HTTPConnection("127.0.0.1", port, timeout=timeout)
    return http.client.HTTPSConnection("127.0.0.1", port, timeout=timeout, context=tls)
