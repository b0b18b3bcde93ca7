"""Python apps served over HTTP/2 cleartext (prior knowledge) by hypercorn (PyPI), each
request making real libcudart calls that encode it, in the shape of an inference step:

  GET /infer?id=N   cudaMemcpy of 100000+N bytes (H2D), 2 x cudaLaunchKernel with grid
                    (N, 1, 1), 10 ms asleep (the other streams run meanwhile), 2 more
                    launches, cudaMemcpy of 200000+N bytes (D2H); the body is N

  python h2_apps.py KIND PORT     (PORT 0: any free port)
KIND: asgi (a plain ASGI app), fastapi-async (a FastAPI `async def` endpoint, on the
loop), fastapi-def (a plain `def` endpoint: anyio's worker threads). Binds, prints
"listening on PORT" to stderr, waits for a line on stdin, then serves."""
from __future__ import annotations

import asyncio
import socket
import sys
import time
from pathlib import Path
from urllib.parse import parse_qs

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from hypercorn.asyncio import serve  # noqa: E402
from hypercorn.config import Config  # noqa: E402

from otel_gpu.demo.cuda_work import D2H, H2D  # noqa: E402
from tests.bpf.targets.async_servers import WORK, launch  # noqa: E402
from tests.bpf.targets.h2_shape import D2H_BASE, H2D_BASE  # noqa: E402

PAUSE_S = 0.010


def before(n: int) -> None:
    WORK.memcpy(H2D_BASE + n, H2D)
    launch(n)
    launch(n)


def after(n: int) -> None:
    launch(n)
    launch(n)
    WORK.memcpy(D2H_BASE + n, D2H)


async def asgi(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    n = int(parse_qs(scope["query_string"].decode()).get("id", ["0"])[0])
    before(n)
    await asyncio.sleep(PAUSE_S)
    after(n)
    body = str(n).encode()
    await send({"type": "http.response.start", "status": 200, "headers": [(b"content-length", b"%d" % len(body))]})
    await send({"type": "http.response.body", "body": body})


def fastapi_app(threads: bool):
    from fastapi import FastAPI
    app = FastAPI()
    if threads:
        @app.get("/infer")
        def infer(id: int) -> int:  # noqa: A002 (the query's name)
            before(id)
            time.sleep(PAUSE_S)
            after(id)
            return id
    else:
        @app.get("/infer")
        async def infer(id: int) -> int:  # noqa: A002
            before(id)
            await asyncio.sleep(PAUSE_S)
            after(id)
            return id
    return app


def main() -> None:
    kind = sys.argv[1]
    app = asgi if kind == "asgi" else fastapi_app(threads=kind == "fastapi-def")
    serve_h2c(app, int(sys.argv[2]))


def serve_h2c(app, port: int) -> None:
    """hypercorn serving `app` on 127.0.0.1:`port` (0: any), h2c by prior knowledge: binds,
    prints "listening on PORT", serves once a line comes on stdin (tests/harness.py Target)."""
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(128)
    sock.set_inheritable(True)
    launch(0)  # runtime initialisation before the first request (id 0: no request)
    print(f"listening on {sock.getsockname()[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    config = Config()
    config.bind = [f"fd://{sock.fileno()}"]
    config.loglevel = "WARNING"
    config.h2_max_concurrent_streams = 256  # 128 streams at once on one connection (the default is 100)
    print("serving", file=sys.stderr, flush=True)
    asyncio.run(serve(app, config))


if __name__ == "__main__":
    main()
