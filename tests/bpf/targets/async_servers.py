"""Real third-party Python servers (PyPI) doing real libcudart calls that encode the
request they are made for, so every child span of a trace can be checked:

  GET /infer?id=N&launches=K   K x cudaLaunchKernel with grid (N, 1, 1), then one
                               cudaMemcpy of N bytes (H2D); between calls the handler
                               yields (await asyncio.sleep(0), or time.sleep in a
                               thread), so concurrent requests interleave.

  python async_servers.py KIND PORT      (PORT 0: any free port)

KIND:
  fastapi-async     FastAPI `async def` endpoint on uvicorn, asyncio loop
  fastapi-def       FastAPI plain `def` endpoint: run in anyio's worker threads with a
                    copied contextvars.Context; time.sleep(0.0005) between calls
  aiohttp           aiohttp.web, asyncio loop
  uvloop            fastapi-async on uvicorn with loop="uvloop"
  starlette-stream  Starlette StreamingResponse (SSE, chunked) whose async generator
                    writes a first chunk, then does the GPU work between chunks
  background        fastapi-async plus an asyncio task started at startup that launches
                    grid (0, 1, 1) every 2 ms forever: id 0 belongs to no request
  threaded          control: stdlib ThreadingHTTPServer, thread per connection, the work
                    on the handler thread (today's thread rules are exact here)

Runs under any CPython 3.10+ that has the servers and the nvidia-cuda-runtime wheel
(the repository root is put on sys.path for otel_gpu.demo.cuda_work). Binds first,
prints "listening on PORT" to stderr, then waits for a line on stdin before serving,
so the test can let the collector pick the process up first (tests/harness.py Target)."""
from __future__ import annotations

import asyncio
import os
import socket
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs, urlparse

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from otel_gpu.demo.cuda_work import H2D, CudaWork, Dim3  # noqa: E402

BLOCK = Dim3(64, 1, 1)
WORK = CudaWork()
KERNEL = WORK.kernel_address("matmul_tile")
BACKGROUND_PERIOD_S = 0.002


def launch(n: int) -> None:
    """One cudaLaunchKernel whose grid.x is the request id (0: no request)."""
    WORK.rt.cudaLaunchKernel(KERNEL, Dim3(n, 1, 1), BLOCK, None, 0, None)


def copy(n: int) -> None:
    """One cudaMemcpy of as many bytes as the request id."""
    WORK.memcpy(n, H2D)


def params(query: dict) -> tuple[int, int]:
    return int(query.get("id", 0)), int(query.get("launches", 3))


async def work_async(n: int, k: int) -> None:
    for _ in range(k):
        launch(n)
        await asyncio.sleep(0)
    copy(n)
    await asyncio.sleep(0)


def work_blocking(n: int, k: int) -> None:
    for _ in range(k):
        launch(n)
        time.sleep(0.0005)
    copy(n)


def body(n: int) -> bytes:
    return f"ok {n}\n".encode()


# ---- FastAPI / Starlette on uvicorn -------------------------------------------------

def fastapi_app(kind: str):
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse

    lifespan = None
    if kind == "background":
        from contextlib import asynccontextmanager

        async def background() -> None:
            while True:
                launch(0)
                await asyncio.sleep(BACKGROUND_PERIOD_S)

        @asynccontextmanager
        async def lifespan(app):
            task = asyncio.get_running_loop().create_task(background())
            yield
            task.cancel()

    app = FastAPI(lifespan=lifespan)
    if kind == "fastapi-def":
        @app.get("/infer", response_class=PlainTextResponse)
        def infer(id: int, launches: int = 3):  # noqa: A002 (the query's name)
            work_blocking(id, launches)
            return PlainTextResponse(body(id))
    else:
        @app.get("/infer", response_class=PlainTextResponse)
        async def infer(id: int, launches: int = 3):  # noqa: A002
            await work_async(id, launches)
            return PlainTextResponse(body(id))
    return app


def starlette_stream_app():
    from starlette.applications import Starlette
    from starlette.responses import StreamingResponse
    from starlette.routing import Route

    async def infer(request):
        n, k = params(dict(request.query_params))

        async def events():
            yield b"event: start\ndata: 0\n\n"  # the response head and a first chunk go out first
            for i in range(k):
                launch(n)
                await asyncio.sleep(0)
                yield f"data: {i}\n\n".encode()
            copy(n)
            yield f"event: done\ndata: {n}\n\n".encode()

        return StreamingResponse(events(), media_type="text/event-stream")

    return Starlette(routes=[Route("/infer", infer)])


def run_uvicorn(app, sock: socket.socket, loop: str, lifespan: str) -> None:
    import uvicorn
    config = uvicorn.Config(app, loop=loop, lifespan=lifespan, log_level="warning", access_log=False)
    uvicorn.Server(config).run(sockets=[sock])


# ---- aiohttp -----------------------------------------------------------------------

def run_aiohttp(sock: socket.socket) -> None:
    from aiohttp import web

    async def infer(request):
        n, k = params(dict(request.query))
        await work_async(n, k)
        return web.Response(body=body(n), content_type="text/plain")

    app = web.Application()
    app.router.add_get("/infer", infer)
    web.run_app(app, sock=sock, print=None, access_log=None)


# ---- control: a thread per connection -----------------------------------------------

def run_threaded(sock: socket.socket) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True  # head and body are two writes: no 40 ms delayed-ACK stall

        def log_message(self, *a):
            pass

        def do_GET(self):
            u = urlparse(self.path)
            if u.path != "/infer":
                self.send_error(404)
                return
            n, k = params({key: v[0] for key, v in parse_qs(u.query).items()})
            work_blocking(n, k)
            out = body(n)
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

    class Server(ThreadingHTTPServer):
        daemon_threads = True

    server = Server(sock.getsockname(), H, bind_and_activate=False)
    server.socket.close()
    server.socket = sock
    server.serve_forever()


KINDS = ("fastapi-async", "fastapi-def", "aiohttp", "uvloop", "starlette-stream", "background", "threaded")


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    if kind not in KINDS:
        sys.exit(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)  # inherited by accepted sockets
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    launch(0)  # runtime initialisation before the first request (id 0: no request)
    print(f"listening on {sock.getsockname()[1]} ({kind}, python {sys.version.split()[0]}, pid {os.getpid()})",
          file=sys.stderr, flush=True)
    sys.stdin.readline()  # the test says go once the collector traces us
    if kind in ("fastapi-async", "fastapi-def", "background"):
        run_uvicorn(fastapi_app(kind), sock, loop="asyncio", lifespan="on" if kind == "background" else "off")
    elif kind == "uvloop":
        run_uvicorn(fastapi_app("fastapi-async"), sock, loop="uvloop", lifespan="off")
    elif kind == "starlette-stream":
        run_uvicorn(starlette_stream_app(), sock, loop="asyncio", lifespan="off")
    elif kind == "aiohttp":
        run_aiohttp(sock)
    else:
        run_threaded(sock)


if __name__ == "__main__":
    main()
