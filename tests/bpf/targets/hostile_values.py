"""cuda_http's stdlib server (real libcudart) with the hostile calls of the numeric
reliability tests added (not a new server: cuda_http.handle is extended):

  /hugecopy     cudaMemcpy with a count of 2^64-1 (fails without a GPU; the probe sees it)
  /badconfig    cudaLaunchKernelExC with a config pointer into unmapped memory
  /goodconfig   cudaLaunchKernelExC with a real config: grid 2x3x4, block 64x1x1
Every other path is cuda_http's (404 for unknown ones, such as /search/<word>)."""
from __future__ import annotations

import ctypes as ct
import http.server

import cuda_http
from otel_gpu.demo.cuda_work import Dim3

UNMAPPED = 0x10  # the first page is never mapped


class LaunchConfig(ct.Structure):  # cudaLaunchConfig_t
    _fields_ = [("grid", Dim3), ("block", Dim3), ("dynamicSmemBytes", ct.c_size_t), ("stream", ct.c_void_p),
                ("attrs", ct.c_void_p), ("numAttrs", ct.c_uint)]


rt = cuda_http.WORK.rt
rt.cudaLaunchKernelExC.argtypes = [ct.c_void_p, ct.c_void_p, ct.c_void_p]
GOOD = LaunchConfig(Dim3(2, 3, 4), Dim3(64, 1, 1), 128, None, None, 0)
_base = cuda_http.handle


def handle(path: str) -> tuple[int, bytes]:
    func = ct.c_void_p(cuda_http.WORK.kernel_address("matmul_tile"))
    if path == "/hugecopy":
        rt.cudaMemcpy(None, None, ct.c_size_t(2**64 - 1), 1)
    elif path == "/badconfig":
        rt.cudaLaunchKernelExC(ct.c_void_p(UNMAPPED), func, None)
    elif path == "/goodconfig":
        rt.cudaLaunchKernelExC(ct.byref(GOOD), func, None)
    else:
        return _base(path)
    return 200, b"ok"


cuda_http.handle = handle  # the servers look it up at each request
# Headers and body are two writes: with Nagle on, each keep-alive response waits for the
# client's delayed ACK (~40 ms), and 10,000 requests would take minutes.
http.server.BaseHTTPRequestHandler.disable_nagle_algorithm = True

if __name__ == "__main__":
    cuda_http.main()
