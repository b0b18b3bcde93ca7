"""An HTTP service in device-clock mode for the bpf tier: real libcudart calls, the real
device-clock library (libotel_gpu_cupti.so), and a FAKE CUPTI under it (no GPU here, so the
real one never reports a record): after each real CUDA call the request makes, it plays the
part of CUDA and CUPTI, calling back into the library on the same thread as that call's CUPTI
callback would, then producing the call's activity record.

  GET /infer/N?launches=K&copies=C[&step_us=S]
                                      K launches with grid x = N * 16 + k + 1, then C cudaMemcpy
                                      of N * 1000 + c + 1 bytes host to device. Launch k runs on
                                      the "device" for (N * 100 + k + 1) us, copy c for
                                      (N * 100 + 50 + c) us; each starts S us (10,000) after the one
                                      before, the first LEAD_US after the request's first call,
                                      so a request's device intervals never overlap each other;
                                      then a cudaDeviceSynchronize, and the request waits until its
                                      last device interval has ended, as it would on a GPU.

The library is initialised as the CUDA driver would at cuInit (InitializeInjection), with
OTEL_GPU_CUPTI_LIB naming the fake and OTEL_GPU_DEVICE_CLOCK_FLAG the collector's flag.
Prints "listening on PORT" to stderr, then waits for a line on stdin before serving."""
from __future__ import annotations

import ctypes as ct
import itertools
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from urllib.parse import parse_qs, urlparse

from otel_gpu.demo.cuda_work import H2D, CudaWork

RUNTIME_DOMAIN, CUDA_LAUNCH_KERNEL, CUDA_MEMCPY = 2, 211, 31  # CUPTI's (device_clock/apis.py)
LEAD_US, STEP_US, STREAM = 50, 10_000, 7
WORK = CudaWork()
LIBRARY = ct.CDLL(os.environ["DEVICE_CLOCK_LIBRARY"])
if LIBRARY.InitializeInjection() != 1:
    sys.exit("InitializeInjection failed")
FAKE = ct.CDLL(os.environ["OTEL_GPU_CUPTI_LIB"], mode=os.RTLD_NOLOAD)  # the library's copy
FAKE.fake_cupti_api_call.argtypes = [ct.c_uint32] * 3
FAKE.fake_cupti_kernel.argtypes = [ct.c_uint32, ct.c_uint64, ct.c_uint64, ct.c_uint32, ct.c_uint32]
FAKE.fake_cupti_memcpy.argtypes = [ct.c_uint32, ct.c_uint64, ct.c_uint64, ct.c_uint64, ct.c_uint8, ct.c_uint32,
                                   ct.c_uint32]
CORRELATION = itertools.count(1)
LOCK = threading.Lock()


def cupti_now() -> int:
    t = ct.c_uint64()
    FAKE.cuptiGetTimestamp(ct.byref(t))
    return t.value


def next_correlation() -> int:
    with LOCK:
        return next(CORRELATION)


def infer(n: int, launches: int, copies: int, step_us: int = STEP_US) -> None:
    first, end = None, 0
    for k in range(launches + copies):
        if k < launches:
            WORK.launch("matmul_tile", (n * 16 + k + 1, 1, 1), (128, 1, 1))
        else:
            WORK.memcpy(n * 1000 + (k - launches) + 1, H2D)
        corr = next_correlation()
        FAKE.fake_cupti_api_call(corr, RUNTIME_DOMAIN, CUDA_LAUNCH_KERNEL if k < launches else CUDA_MEMCPY)
        first = first if first is not None else cupti_now() + LEAD_US * 1000
        start = first + k * step_us * 1000
        if k < launches:
            end = start + (n * 100 + k + 1) * 1000
            FAKE.fake_cupti_kernel(corr, start, end, STREAM, 0)
        else:
            c = k - launches
            end = start + (n * 100 + 50 + c) * 1000
            FAKE.fake_cupti_memcpy(corr, start, end, n * 1000 + c + 1, H2D, STREAM, 0)
    WORK.synchronize()
    time.sleep(max(0, end - cupti_now()) / 1e9)


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        u = urlparse(self.path)
        q = {k: int(v[0]) for k, v in parse_qs(u.query).items()}
        status = 404
        if u.path.startswith("/infer/"):
            infer(int(u.path.rsplit("/", 1)[1]), q.get("launches", 1), q.get("copies", 0), q.get("step_us", STEP_US))
            status = 200
        self.send_response(status)
        self.send_header("Content-Length", "2")
        self.end_headers()
        self.wfile.write(b"ok")


def main() -> None:
    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    server.serve_forever()


if __name__ == "__main__":
    main()
