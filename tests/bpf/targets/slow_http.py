"""A stdlib HTTP service (ThreadingHTTPServer, real libcudart) for the reliability
tests: GET and POST, and a slow route that has made its CUDA calls before it answers.

  /work?launches=K            K launches on the handling thread, then 200 "ok"
  /slow?launches=K&ms=M       K launches, prints "launched K" to stderr, sleeps M ms, 200 "ok"
A POST body is read (Content-Length) and ignored. With RELIA_COMM set, the process
renames itself (prctl PR_SET_NAME) so a collector can select it with --exe.
Prints "listening on PORT" to stderr, then waits for a line on stdin before serving."""
from __future__ import annotations

import ctypes as ct
import os
import sys
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

if os.environ.get("RELIA_COMM"):
    ct.CDLL(None).prctl(15, os.environ["RELIA_COMM"].encode()[:15], 0, 0, 0)  # PR_SET_NAME

from otel_gpu.demo.cuda_work import CudaWork  # noqa: E402

WORK = CudaWork()
GRID, BLOCK = (5, 1, 1), (64, 1, 1)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def _serve(self):
        n = int(self.headers.get("Content-Length") or 0)
        if n:
            self.rfile.read(n)
        u = urlparse(self.path)
        q = {k: v[0] for k, v in parse_qs(u.query).items()}
        status = 200
        if u.path in ("/work", "/slow"):
            k = int(q.get("launches", 0))
            for _ in range(k):
                WORK.launch("softmax", GRID, BLOCK)
            if u.path == "/slow":
                print(f"launched {k}", file=sys.stderr, flush=True)
                time.sleep(int(q.get("ms", 1000)) / 1000)
        else:
            status = 404
        body = b"ok" if status == 200 else b"not found"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    do_GET = do_POST = _serve


def main() -> None:
    ThreadingHTTPServer.request_queue_size = 1024  # the stdlib's 5 turns a burst of connects into SYN retries
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0), Handler)
    server.daemon_threads = True
    print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    server.serve_forever()


if __name__ == "__main__":
    main()
