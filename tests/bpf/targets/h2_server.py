"""hypercorn (PyPI) serving a plain ASGI app over HTTP/2 cleartext (prior knowledge:
hypercorn switches to HTTP/2 on the client preface), each request doing real
libcudart calls that encode it:

  GET /infer?id=N&launches=K[&pause_ms=P]
                               K x cudaLaunchKernel with grid (N, 1, 1), then one
                               cudaMemcpy of N bytes (H2D), yielding to the loop between
                               calls so concurrent streams interleave; with P, asleep
                               P ms after the first launch (streams then overlap for sure)

  python h2_server.py PORT     (0: any free port)
Binds, prints "listening on PORT" to stderr, waits for a line on stdin, then serves
(hypercorn takes the bound socket by fd)."""
from __future__ import annotations

import asyncio
import sys
from pathlib import Path
from urllib.parse import parse_qs

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from tests.bpf.targets.async_servers import copy, launch  # noqa: E402
from tests.bpf.targets.h2_apps import serve_h2c  # noqa: E402


async def app(scope, receive, send):
    if scope["type"] == "lifespan":
        while (await receive())["type"] != "lifespan.shutdown":
            await send({"type": "lifespan.startup.complete"})
        await send({"type": "lifespan.shutdown.complete"})
        return
    q = {k: v[0] for k, v in parse_qs(scope["query_string"].decode()).items()}
    n, k, pause = int(q.get("id", 0)), int(q.get("launches", 3)), int(q.get("pause_ms", 0))
    status = 200 if scope["path"] == "/infer" else 404
    if status == 200:
        for i in range(k):
            launch(n)
            await asyncio.sleep(pause / 1000 if pause and i == 0 else 0)
        copy(n)
    body = str(n).encode()
    await send({"type": "http.response.start", "status": status,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def main() -> None:
    serve_h2c(app, int(sys.argv[1]) if len(sys.argv) > 1 else 0)


if __name__ == "__main__":
    main()
