"""An HTTP service whose routes each spend ~40 ms in a different way, for the time split
(otel_gpu/pipeline/time_split.py): a stdlib ThreadingHTTPServer ("stdlib", a thread per
request) or an ASGI app on uvicorn ("asgi", one event-loop thread for all). Each route's
path ends in the request's number k:

  /cpu/{k}        40 ms of CPU time
  /sleep/{k}      asleep 40 ms
  /sync/{k}       cudaDeviceSynchronize on a stub libcudart whose sync sleeps 40 ms (STUB_CUDART)
  /contended/{k}  40 ms of CPU time on CPU 0, which HOGS busy processes share meanwhile
  /naps/{k}       on CPU 0 beside the HOGS, NAPS sleeps of NAP_S, each woken into a queue for
                  the CPU; the body is "ok <runtime> <run_delay> <wall>": this thread's
                  /proc/thread-self/schedstat deltas over the work (the kernel's own ns on
                  the CPU and waiting for it) and the wall-clock ns of the work, read
                  inside those two

Prints "listening on PORT", waits for "go" on stdin, then serves. Args: kind port"""
from __future__ import annotations

import asyncio
import ctypes as ct
import os
import signal
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

WORK_S = 0.04
HOGS = 2
CUDART = None  # loaded at "go": the tests import this module, and a test process maps no GPU library


def spin(seconds: float) -> None:
    """Spends `seconds` of this thread's CPU time."""
    end = time.thread_time() + seconds
    while time.thread_time() < end:
        pass


def hog() -> int:
    """A busy process on CPU 0 (forked: no interpreter start), returned once it spins there
    (a busy host can start it late: the work beside it would then share nothing)."""
    ready, told = os.pipe()
    pid = os.fork()
    if pid == 0:
        os.sched_setaffinity(0, {0})
        os.write(told, b"x")
        while True:
            pass
    os.close(told)
    try:
        os.read(ready, 1)
    finally:
        os.close(ready)
    return pid


NAPS, NAP_S = 40, 0.001


def beside_hogs(job) -> None:
    hogs = [hog() for _ in range(HOGS)]
    os.sched_setaffinity(0, {0})  # this thread, onto the hogs' CPU
    try:
        job()
    finally:
        os.sched_setaffinity(0, range(os.cpu_count() or 1))
        for pid in hogs:
            os.kill(pid, signal.SIGKILL)
            os.waitpid(pid, 0)


def schedstat() -> tuple[int, int]:
    """This thread's ns on the CPU and waiting for it, as the kernel counts them."""
    with open("/proc/thread-self/schedstat") as f:
        runtime, run_delay, _ = f.read().split()
    return int(runtime), int(run_delay)


def naps() -> bytes:
    def job():
        # At a low priority (nice 10) the woken thread does not preempt the hogs at once
        # (EEVDF gives it a later deadline): each wake-up queues, however busy the host.
        tid = threading.get_native_id()
        os.setpriority(os.PRIO_PROCESS, tid, 10)
        try:
            for _ in range(NAPS):
                time.sleep(NAP_S)
        finally:
            os.setpriority(os.PRIO_PROCESS, tid, 0)
    before, start = schedstat(), time.monotonic_ns()
    beside_hogs(job)
    end, after = time.monotonic_ns(), schedstat()
    return f"ok {after[0] - before[0]} {after[1] - before[1]} {end - start}".encode()


def work(route: str):
    """The route's work; its body (True: "ok"), or False for no such route."""
    if route == "cpu":
        spin(WORK_S)
    elif route == "sleep":
        time.sleep(WORK_S)
    elif route == "sync":
        CUDART.cudaDeviceSynchronize()
    elif route == "contended":
        beside_hogs(lambda: spin(WORK_S))
    elif route == "naps":
        return naps()
    else:
        return False
    return True


def route_of(path: str) -> str:
    parts = path.split("?")[0].strip("/").split("/")
    return parts[0] if len(parts) == 2 and parts[1].isdigit() else ""


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        ok = work(route_of(self.path))
        body = ok if isinstance(ok, bytes) else b"ok" if ok else b"not found"
        self.send_response(200 if ok else 404)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    route = route_of(scope["path"])
    ok = route in ("cpu", "sleep")
    if route == "cpu":
        spin(WORK_S)  # on the loop thread: the others wait for it
    elif route == "sleep":
        await asyncio.sleep(WORK_S)  # the loop serves the others meanwhile
    body = b"ok" if ok else b"not found"
    await send({"type": "http.response.start", "status": 200 if ok else 404,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    global CUDART
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind == "stdlib":
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        port = server.server_address[1]
    print(f"listening on {port}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    if os.environ.get("STUB_CUDART"):
        CUDART = ct.CDLL(os.environ["STUB_CUDART"])
    if kind == "stdlib":
        server.serve_forever()
    else:
        import uvicorn
        uvicorn.run(asgi_app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
