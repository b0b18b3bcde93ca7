"""An HTTP service that launches kernels by handle, as cuBLAS, Triton and CUDA 13
`<<<>>>` code do on a GPU, through stub libraries (no GPU here): STUB_LIBCUDA (the
driver: cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction, cuLaunchKernel)
and STUB_CUDART13 (__cudaGetKernel handing out opaque handles, __cudaLaunchKernel).
The handles are taken once, after "go", as a library takes them at load; then

  /launch   cuLaunchKernel by CUfunction (grid.x 1), by CUkernel (2), by CUfunction
            of a CUkernel (3), by a handle no probed call gave out (4), and
            __cudaLaunchKernel by the handle of host stub vec_add (5)

Prints "listening on PORT" to stderr, then waits for a line on stdin."""
from __future__ import annotations

import ctypes as ct
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UNKNOWN = 0x7F0000ABC000
vp, u = ct.c_void_p, ct.c_uint
drv, rt = ct.CDLL(os.environ["STUB_LIBCUDA"]), ct.CDLL(os.environ["STUB_CUDART13"])
drv.cuLaunchKernel.argtypes = [vp, u, u, u, u, u, u, u, vp, vp, vp]


class Dim3(ct.Structure):
    _fields_ = [("x", u), ("y", u), ("z", u)]


rt.__cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, vp, ct.c_size_t, vp]


def handle(fn, *args) -> int:
    h = vp(0)
    assert fn(ct.byref(h), *args) == 0
    return h.value


def take_handles() -> list[int]:
    function = handle(drv.cuModuleGetFunction, vp(0x10), b"_Z9my_kernelPf")
    kernel = handle(drv.cuLibraryGetKernel, vp(0x20), b"triton_poi_fused_add_0")
    kernel_function = handle(drv.cuKernelGetFunction, vp(kernel))
    stub_handle = handle(getattr(rt, "__cudaGetKernel"), ct.cast(rt._Z7vec_addPfi, vp))
    return [function, kernel, kernel_function, UNKNOWN, stub_handle]


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    handles: list[int] = []

    def log_message(self, *a):
        pass

    def do_GET(self):
        status, body = 404, b"not found"
        if self.path == "/launch":
            for i, h in enumerate(self.handles[:4], 1):
                drv.cuLaunchKernel(h, i, 1, 1, 32, 1, 1, 0, None, None, None)
            getattr(rt, "__cudaLaunchKernel")(vp(self.handles[4]), Dim3(5, 1, 1), Dim3(32, 1, 1), None, 0, None)
            status, body = 200, b"ok"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", int(sys.argv[1]) if len(sys.argv) > 1 else 0), H)
    print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    H.handles = take_handles()
    server.serve_forever()
