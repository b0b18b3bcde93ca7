"""A CUDA-calling HTTP service for the bpf tier: real libcudart, and one of three
servers (stdlib ThreadingHTTPServer, a WSGI app on a threaded wsgiref server, an
ASGI app on uvicorn/asyncio). Routes do exactly the CUDA work their query asks:

  /work?launches=K&copies=M&h2d=B&d2h=B&syncs=S[&meet=1]   on the handling thread; with
                                          meet, once another such request is in too (both open together)
  /handoff?launches=K                     on a new thread, joined before replying
  /together?launches=K                    waits until 2 requests are in, then works
                                          on a new thread (ambiguous by design)
  /driver?launches=K                      cuLaunchKernel x K on a stub libcuda
  /both                                   the same dims on one thread: a real-libcudart launch (no
                                          driver here), a driver launch of our own, then a stub
                                          libcudart launch that reaches the stub libcuda (3 launches)
  /cost?launches=K&hold_ms=M[&pair=1]     K launches, M ms as if the GPU were busy, then a
                                          device synchronize (pair: starts with another one)
Prints "listening on PORT" to stderr, then waits for a line on stdin before
serving, so the test can let the collector pick the process up first."""
from __future__ import annotations

import ctypes as ct
import os
import sys
import threading
import time
from urllib.parse import parse_qs, urlparse

from otel_gpu.demo.cuda_work import D2H, H2D, CudaWork

GRID, BLOCK, SHMEM = (7, 3, 1), (128, 2, 1), 256
WORK = CudaWork()
DRIVER = ct.CDLL(os.environ["STUB_LIBCUDA"]) if os.environ.get("STUB_LIBCUDA") else None
# A stub libcudart that reaches DRIVER's cuLaunchKernel, as the real one does on a GPU.
STUB_CUDART = ct.CDLL(os.environ["STUB_CUDART"]) if os.environ.get("STUB_CUDART") else None
BARRIER = threading.Barrier(2, timeout=10)
PAIR = threading.Barrier(2, timeout=10)
MEET = threading.Barrier(2, timeout=10)  # /work?meet=1 on the threaded servers


class AsyncMeet:
    """/work?meet=1 on the ASGI server: two requests wait for each other on the loop."""

    def __init__(self) -> None:
        self.waiting: list = []

    async def wait(self) -> None:
        import asyncio
        fut = asyncio.get_running_loop().create_future()
        self.waiting.append(fut)
        if len(self.waiting) == 2:
            for f in self.waiting:
                f.set_result(None)
            self.waiting = []
        await asyncio.wait_for(fut, 10)


def do_work(q: dict) -> None:
    for _ in range(int(q.get("launches", 0))):
        WORK.launch("matmul_tile", GRID, BLOCK, SHMEM)
    for i in range(int(q.get("copies", 0))):
        if i % 2 == 0:
            WORK.memcpy(int(q.get("h2d", 4096)), H2D)
        else:
            WORK.memcpy(int(q.get("d2h", 1024)), D2H)
    for _ in range(int(q.get("syncs", 0))):
        WORK.synchronize()


def driver_launch() -> None:
    DRIVER.cuLaunchKernel(ct.c_void_p(0x1234), *GRID, *BLOCK, SHMEM, None, None, None)


def handle(path: str) -> tuple[int, bytes]:
    u = urlparse(path)
    q = {k: v[0] for k, v in parse_qs(u.query).items()}
    if u.path == "/work":
        if q.get("meet") and not q.get("met"):
            MEET.wait()
        do_work(q)
    elif u.path == "/handoff":
        t = threading.Thread(target=do_work, args=(q,))
        t.start()
        t.join()
    elif u.path == "/together":
        BARRIER.wait()
        t = threading.Thread(target=do_work, args=(q,))
        t.start()
        t.join()
        BARRIER.wait()  # both stay open until both are done
    elif u.path == "/cost":
        if q.get("pair"):
            PAIR.wait()
        do_work(q)
        time.sleep(int(q.get("hold_ms", 0)) / 1000)  # on a GPU, the synchronize would wait here
        WORK.synchronize()
    elif u.path == "/driver":
        for _ in range(int(q.get("launches", 1))):
            driver_launch()
    elif u.path == "/both":
        from otel_gpu.demo.cuda_work import Dim3
        WORK.launch("matmul_tile", GRID, BLOCK, SHMEM)
        driver_launch()
        STUB_CUDART.cudaLaunchKernel(ct.c_void_p(WORK.kernel_address("matmul_tile")), Dim3(*GRID), Dim3(*BLOCK),
                                     None, ct.c_size_t(SHMEM), None)
    else:
        return 404, b"not found"
    return 200, b"ok"


def serve_stdlib(port: int):
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            status, body = handle(self.path)
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    return ThreadingHTTPServer(("127.0.0.1", port), H)


def serve_wsgi(port: int):
    from socketserver import ThreadingMixIn
    from wsgiref.simple_server import WSGIRequestHandler, WSGIServer, make_server

    class ThreadingWSGIServer(ThreadingMixIn, WSGIServer):
        daemon_threads = True

    class Quiet(WSGIRequestHandler):
        def log_message(self, *a):
            pass

    def app(environ, start_response):
        path = environ["PATH_INFO"] + ("?" + environ["QUERY_STRING"] if environ.get("QUERY_STRING") else "")
        status, body = handle(path)
        start_response(f"{status} X", [("Content-Length", str(len(body)))])
        return [body]

    return make_server("127.0.0.1", port, app, server_class=ThreadingWSGIServer, handler_class=Quiet)


def run_asgi(port: int, ready) -> None:
    import uvicorn
    meet = AsyncMeet()

    async def app(scope, receive, send):
        if scope["type"] != "http":
            return
        path = scope["path"] + ("?" + scope["query_string"].decode() if scope["query_string"] else "")
        if scope["path"] == "/work" and "meet=1" in path:
            await meet.wait()  # on the loop: a blocking barrier would hold the other request out
            path += "&met=1"
        status, body = handle(path)
        await send({"type": "http.response.start", "status": status,
                    "headers": [(b"content-length", str(len(body)).encode())]})
        await send({"type": "http.response.body", "body": body})

    config = uvicorn.Config(app, host="127.0.0.1", port=port, log_level="warning", lifespan="off", loop="asyncio",
                            timeout_keep_alive=120)  # idle keep-alive outlives a slow collector start (tests under load)
    server = uvicorn.Server(config)
    ready()
    server.run()


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])

    def ready(p=port):
        print(f"listening on {p}", file=sys.stderr, flush=True)
        sys.stdin.readline()  # the test says go once the collector traces us

    if kind == "asgi":
        run_asgi(port, ready)
        return
    server = serve_stdlib(port) if kind == "stdlib" else serve_wsgi(port)
    ready(server.server_address[1])
    server.serve_forever()


if __name__ == "__main__":
    main()
