"""HTTPS servers for the TLS probes (bpf/tls_probes.c), doing the real libcudart calls
of tests/bpf/targets/async_servers.py that encode their request id:

  GET  /infer?id=N&launches=K   K x cudaLaunchKernel grid (N, 1, 1), one cudaMemcpy of N bytes
  POST /infer?id=N&launches=K   the same once the whole body is read; the body says its
                                length back ("ok N len L")

  python tls_servers.py KIND PORT CERT KEY     (PORT 0: any free port)

KIND:
  uvicorn    Starlette on uvicorn, asyncio loop: ssl through sslproto's memory BIO
  uvloop     the same on uvloop (its own sslproto, memory BIO)
  threaded   stdlib ThreadingHTTPServer on an ssl-wrapped socket (a socket BIO: SSL_read
             makes the read() itself), the handshake in the accepting thread

Binds first, prints "listening on PORT", then serves after a line on stdin
(tests/harness.py Target)."""
from __future__ import annotations

import os
import socket
import ssl
import sys
from pathlib import Path
from urllib.parse import parse_qs, urlparse

if os.environ.get("TARGET_COMM"):  # a name of its own, which a collector's --exe selects
    import ctypes
    ctypes.CDLL(None).prctl(15, os.environ["TARGET_COMM"].encode()[:15], 0, 0, 0)  # PR_SET_NAME

sys.path.insert(0, str(Path(__file__).resolve().parent))
from async_servers import launch, params, work_async, work_blocking  # noqa: E402


def reply(n: int, size: int | None) -> bytes:
    return (f"ok {n}" + ("" if size is None else f" len {size}") + "\n").encode()


def starlette_app():
    from starlette.applications import Starlette
    from starlette.responses import PlainTextResponse
    from starlette.routing import Route

    async def infer(request):
        n, k = params(dict(request.query_params))
        size = len(await request.body()) if request.method == "POST" else None
        await work_async(n, k)
        return PlainTextResponse(reply(n, size))

    return Starlette(routes=[Route("/infer", infer, methods=["GET", "POST"])])


def run_uvicorn(sock: socket.socket, loop: str, cert: str, key: str) -> None:
    import uvicorn
    config = uvicorn.Config(starlette_app(), loop=loop, lifespan="off", log_level="warning", access_log=False,
                            ssl_certfile=cert, ssl_keyfile=key)
    uvicorn.Server(config).run(sockets=[sock])


def run_threaded(sock: socket.socket, cert: str, key: str) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"
        disable_nagle_algorithm = True

        def log_message(self, *a):
            pass

        def _serve(self, size: int | None) -> None:
            u = urlparse(self.path)
            if u.path != "/infer":
                self.send_error(404)
                return
            n, k = params({key: v[0] for key, v in parse_qs(u.query).items()})
            work_blocking(n, k)
            out = reply(n, size)
            self.send_response(200)
            self.send_header("Content-Length", str(len(out)))
            self.end_headers()
            self.wfile.write(out)

        def do_GET(self):
            self._serve(None)

        def do_POST(self):
            self._serve(len(self.rfile.read(int(self.headers.get("Content-Length", 0)))))

    class Server(ThreadingHTTPServer):
        daemon_threads = True

    ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    ctx.load_cert_chain(cert, key)
    server = Server(sock.getsockname(), H, bind_and_activate=False)
    server.socket.close()
    server.socket = ctx.wrap_socket(sock, server_side=True)
    server.serve_forever()


KINDS = ("uvicorn", "uvloop", "threaded")


def main() -> None:
    kind, port, cert, key = sys.argv[1], int(sys.argv[2]), sys.argv[3], sys.argv[4]
    if kind not in KINDS:
        sys.exit(f"unknown kind {kind!r}: one of {', '.join(KINDS)}")
    sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
    sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    sock.bind(("127.0.0.1", port))
    sock.listen(1024)
    launch(0)  # runtime initialisation before the first request
    print(f"listening on {sock.getsockname()[1]} ({kind} https, pid {os.getpid()})", file=sys.stderr, flush=True)
    sys.stdin.readline()
    if kind == "threaded":
        run_threaded(sock, cert, key)
    else:
        run_uvicorn(sock, "asyncio" if kind == "uvicorn" else "uvloop", cert, key)


if __name__ == "__main__":
    main()
