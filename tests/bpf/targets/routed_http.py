"""An HTTP service whose runtime launches reach the driver, as every launch does on a GPU:
the stand-in libcudart (STUB_CUDART, tests/bpf/targets/stub_cudart_driver.c) passes the
stand-in libcuda (STUB_LIBCUDA) a handle of its own for each host stub.

  /launch/<id>/<kernels>   for each kernel letter at index k (a: vec_add, b: scale):
                           cudaLaunchKernel twice with grid (id, k + 1, 1), then
                           cudaLaunchKernelExC once with grid (id, k + 1, 2)

Prints "listening on PORT" to stderr, then waits for a line on stdin."""
from __future__ import annotations

import ctypes as ct
import os
import struct
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

vp, u, size_t = ct.c_void_p, ct.c_uint, ct.c_size_t
drv = ct.CDLL(os.environ["STUB_LIBCUDA"], mode=ct.RTLD_GLOBAL)
rt = ct.CDLL(os.environ["STUB_CUDART"])


class Dim3(ct.Structure):
    _fields_ = [("x", u), ("y", u), ("z", u)]


rt.cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, vp, size_t, vp]
rt.cudaLaunchKernelExC.argtypes = [vp, vp, vp]
KERNELS = {"a": ct.cast(rt._Z7vec_addPfi, vp), "b": ct.cast(rt._Z5scalePfi, vp)}


def launch(request_id: int, kernels: str) -> None:
    for k, letter in enumerate(kernels):
        func = KERNELS[letter]
        for _ in range(2):
            assert rt.cudaLaunchKernel(func, Dim3(request_id, k + 1, 1), Dim3(64, 1, 1), None, 0, None) == 0
        cfg = ct.create_string_buffer(struct.pack("<6IQQQI4x", request_id, k + 1, 2, 64, 1, 1, 0, 0, 0, 0))
        assert rt.cudaLaunchKernelExC(cfg, func, None) == 0


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        parts = self.path.split("/")
        status, body = 404, b"not found"
        if len(parts) == 4 and parts[1] == "launch":
            launch(int(parts[2]), parts[3])
            status, body = 200, b"ok"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


server = ThreadingHTTPServer(("127.0.0.1", 0), H)
print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
sys.stdin.readline()
server.serve_forever()
