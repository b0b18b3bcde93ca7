"""The demo GPU service: a ThreadingHTTPServer whose routes do known CUDA work
through the real libcudart.

  GET  /infer/<id>   4 launches (matmul_tile x2, layernorm, softmax), 64 KiB H2D,
                     4 KiB D2H, one device synchronize
  POST /embed        2 launches (embed_gather x2), request body size H2D, 1 KiB D2H
  GET  /health       no CUDA work
"""
from __future__ import annotations

import argparse
import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from .cuda_work import D2H, H2D, CudaWork

WORK: CudaWork | None = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *args) -> None:  # keep the demo output to the traces
        pass

    def _reply(self, status: int, payload: dict) -> None:
        body = json.dumps(payload).encode()
        self.send_response(status)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)

    def do_GET(self) -> None:
        if self.path.startswith("/infer/"):
            w = WORK
            w.memcpy(64 * 1024, H2D)
            w.launch("matmul_tile", (64, 64, 1), (16, 16, 1), 8192)
            w.launch("matmul_tile", (64, 64, 1), (16, 16, 1), 8192)
            w.launch("layernorm", (256, 1, 1), (256, 1, 1))
            w.launch("softmax", (256, 1, 1), (128, 1, 1))
            w.memcpy(4 * 1024, D2H)
            rc = w.synchronize()
            self._reply(200, {"id": self.path.rsplit("/", 1)[1], "cuda_rc": rc})
        elif self.path == "/health":
            self._reply(200, {"ok": True})
        else:
            self._reply(404, {"error": "not found"})

    def do_POST(self) -> None:
        n = int(self.headers.get("Content-Length", 0))
        data = self.rfile.read(n)
        if self.path != "/embed":
            self._reply(404, {"error": "not found"})
            return
        w = WORK
        w.memcpy(max(len(data), 1), H2D)
        w.launch("embed_gather", (len(data) // 32 + 1, 1, 1), (32, 1, 1))
        w.launch("embed_gather", (len(data) // 32 + 1, 1, 1), (32, 1, 1))
        w.memcpy(1024, D2H)
        self._reply(200, {"embedded": len(data)})


def main(argv=None) -> None:
    global WORK
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=8000)
    args = ap.parse_args(argv)
    WORK = CudaWork()
    server = ThreadingHTTPServer(("127.0.0.1", args.port), Handler)
    print(f"demo service on 127.0.0.1:{server.server_address[1]} using {WORK.path}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
