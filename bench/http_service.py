"""The benchmark's GPU HTTP service (stdlib ThreadingHTTPServer, real libcudart):

  GET /work        100 cudaLaunchKernel + 2 cudaMemcpy (64 KiB H2D, 4 KiB D2H)
  GET /layers      the same, its 100 launches over 32 distinct kernels (a model's layers)
  GET /launch/<n>  n cudaLaunchKernel (n <= 100000)
  --tls CERT,KEY   HTTPS on an ssl-wrapped socket

Arguments are prepared once, so the Python cost per call is small and the
tracing overhead shows. Prints "listening on <port>" when it serves."""
from __future__ import annotations

import argparse
import ctypes as ct
import ssl
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

from otel_gpu.demo.cuda_work import D2H, H2D, CudaWork, Dim3

LAUNCHES_PER_WORK = 100
LAYERS = 32  # distinct kernels of GET /layers (otel_gpu/demo/kernels.c layer_NN)
MAX_LAUNCHES = 100_000


class Gpu:
    def __init__(self) -> None:
        w = CudaWork()
        self.launch_fn = w.rt.cudaLaunchKernel
        self.memcpy_fn = w.rt.cudaMemcpy
        self.func = w.kernel_address("matmul_tile")
        self.layer_funcs = [w.kernel_address(f"_Z8layer_{k:02d}Pf") for k in range(LAYERS)]
        self.grid, self.block = Dim3(64, 64, 1), Dim3(16, 16, 1)
        self.buf = ct.create_string_buffer(64 * 1024)

    def launches(self, n: int) -> None:
        f, func, grid, block = self.launch_fn, self.func, self.grid, self.block
        for _ in range(n):
            f(func, grid, block, None, 8192, None)

    def work(self, layers: bool = False) -> None:
        self.memcpy_fn(self.buf, self.buf, 64 * 1024, H2D)
        if layers:  # layer after layer, as a forward pass launches them
            f, funcs, grid, block = self.launch_fn, self.layer_funcs, self.grid, self.block
            for i in range(LAUNCHES_PER_WORK):
                f(funcs[i % LAYERS], grid, block, None, 8192, None)
        else:
            self.launches(LAUNCHES_PER_WORK)
        self.memcpy_fn(self.buf, self.buf, 4 * 1024, D2H)


GPU: Gpu | None = None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True  # header and body are two writes: no 40 ms delayed-ACK stall

    def log_message(self, *args) -> None:
        pass

    def do_GET(self) -> None:
        if self.path == "/work":
            GPU.work()
        elif self.path == "/layers":
            GPU.work(layers=True)
        elif self.path.startswith("/launch/") and self.path[8:].isdigit() and int(self.path[8:]) <= MAX_LAUNCHES:
            GPU.launches(int(self.path[8:]))
        else:
            self.send_error(404)
            return
        self.send_response(200)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


class Server(ThreadingHTTPServer):
    request_queue_size = 4096  # the listen backlog (the stdlib's 5 drops SYNs under item 18's thousands)


def main(argv=None) -> None:
    global GPU
    ap = argparse.ArgumentParser()
    ap.add_argument("--port", type=int, default=0)
    ap.add_argument("--tls", metavar="CERT,KEY", help="serve HTTPS (bench item 9)")
    args = ap.parse_args(argv)
    GPU = Gpu()
    GPU.launches(10)  # runtime initialisation before the first request
    server = Server(("127.0.0.1", args.port), Handler)
    if args.tls:
        ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
        ctx.load_cert_chain(*args.tls.split(","))
        server.socket = ctx.wrap_socket(server.socket, server_side=True)
    print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
    server.serve_forever()


if __name__ == "__main__":
    main()
