"""A HIP-calling HTTP service for the bpf tier: Debian's real libamdhip64 (no AMD GPU here:
every call returns an error at once, and the probes see the real arguments), served by a
stdlib ThreadingHTTPServer ("stdlib") or an ASGI app on uvicorn ("asgi", the calls made in
each request's asyncio task). Every call of request k carries k (HIP_WORK below):

  /infer/{k}   a copy in, three launches (two named by their kernel handles' symbols, one
               by its registration only), a module launch, 10 ms, a graph launch, a copy
               out, an allocation and its free, a stream synchronize

After "go" on stdin it registers its unnamed kernel (__hipRegisterFunction, as hipcc's
start-up code does) and serves; "outside N" makes N launches with no request open. Prints
"listening on PORT" first. Args: kind port kernels.so"""
from __future__ import annotations

import asyncio
import ctypes as ct
import glob
import os
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

H2D, D2H = 1, 2  # hipMemcpyKind
STREAM = 0x5000  # request k's stream: STREAM + k
GRAPH_EXEC = 0x9000  # request k's graph exec: GRAPH_EXEC + k
MODULE_FUNCTION = 0x7A00  # a hipFunction_t no probed call named
# What the launches run: two handles with symbols (hip_kernels.c), one named only by its
# registration (a buffer: no symbol covers it).
NAMED = {"vector_add": "_Z10vector_addPKfS0_Pfi", "reduce_sum": "_Z10reduce_sumPKfPfi"}
REGISTERED = "_Z15softmax_rowwisePfi"


def find_hip() -> str:
    hits = sorted(glob.glob("/usr/lib/x86_64-linux-gnu/libamdhip64.so*") + glob.glob("/opt/rocm*/lib/libamdhip64.so*"))
    return os.environ.get("OTEL_GPU_HIP") or (hits[0] if hits else "libamdhip64.so.5")


class Dim3(ct.Structure):
    _fields_ = [("x", ct.c_uint), ("y", ct.c_uint), ("z", ct.c_uint)]


vp, u32, size_t = ct.c_void_p, ct.c_uint, ct.c_size_t
SIGNATURES = {"hipLaunchKernel": [vp, Dim3, Dim3, vp, size_t, vp],
              "hipExtLaunchKernel": [vp, Dim3, Dim3, vp, size_t, vp, vp, vp, ct.c_int],
              "hipModuleLaunchKernel": [vp, u32, u32, u32, u32, u32, u32, u32, vp, vp, vp],
              "hipMemcpyHtoD": [vp, vp, size_t], "hipMemcpyAsync": [vp, vp, size_t, ct.c_int, vp],
              "hipMalloc": [ct.POINTER(vp), size_t], "hipFree": [vp], "hipStreamSynchronize": [vp],
              "hipGraphLaunch": [vp, vp],
              "__hipRegisterFunction": [vp, vp, ct.c_char_p, ct.c_char_p, u32, vp, vp, vp, vp, vp]}
# Loaded in main() only: the tests import find_hip, and a test process must not map a GPU library.
hip = None
HANDLES: dict[str, int] = {}
UNNAMED = ct.create_string_buffer(8)  # the registered kernel's handle
HOST = ct.create_string_buffer(1 << 20)


def load(kernels_path: str) -> None:
    global hip
    hip = ct.CDLL(find_hip())
    for name, args in SIGNATURES.items():
        getattr(hip, name).argtypes = args
    kernels = ct.CDLL(kernels_path)
    HANDLES.update({k: ct.cast(getattr(kernels, sym), vp).value for k, sym in NAMED.items()})


def register() -> None:
    """As hipcc's start-up code registers each kernel of a program (modules: none here)."""
    name = REGISTERED.encode()
    hip.__hipRegisterFunction(None, ct.addressof(UNNAMED), name, name, 0xFFFFFFFF, None, None, None, None, None)


def work_before(k: int) -> None:
    stream = vp(STREAM + k)
    hip.hipMemcpyHtoD(vp(0x10), HOST, 100000 + k)
    hip.hipLaunchKernel(HANDLES["vector_add"], Dim3(k, 1, 1), Dim3(128, 1, 1), None, 16 * k, stream)
    hip.hipExtLaunchKernel(HANDLES["reduce_sum"], Dim3(k, 2, 1), Dim3(64, 1, 1), None, 0, stream, None, None, 0)
    hip.hipLaunchKernel(ct.addressof(UNNAMED), Dim3(k, 1, 3), Dim3(32, 1, 1), None, 0, stream)
    hip.hipModuleLaunchKernel(vp(MODULE_FUNCTION), k, 1, 1, 256, 1, 1, 0, stream, None, None)


def work_after(k: int) -> None:
    stream = vp(STREAM + k)
    hip.hipGraphLaunch(vp(GRAPH_EXEC + k), stream)
    hip.hipMemcpyAsync(HOST, vp(0x10), 200000 + k, D2H, stream)
    ptr = vp()
    hip.hipMalloc(ct.byref(ptr), 4096 + k)
    hip.hipFree(ptr)
    hip.hipStreamSynchronize(stream)


def request_number(path: str) -> int | None:
    head, _, k = path.partition("?")[0].rpartition("/")
    return int(k) if head == "/infer" and k.isdigit() else None


class Handler(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    disable_nagle_algorithm = True

    def log_message(self, *a):
        pass

    def do_GET(self):
        k = request_number(self.path)
        status, body = (404, b"not found") if k is None else (200, b"ok")
        if k is not None:
            work_before(k)
            time.sleep(0.01)  # concurrent requests overlap
            work_after(k)
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


async def asgi_app(scope, receive, send):
    if scope["type"] != "http":
        return
    k = request_number(scope["path"])
    if k is not None:
        work_before(k)
        await asyncio.sleep(0.01)  # other requests' tasks run meanwhile, on this thread
        work_after(k)
    body = b"ok" if k is not None else b"not found"
    await send({"type": "http.response.start", "status": 200 if k is not None else 404,
                "headers": [(b"content-length", str(len(body)).encode())]})
    await send({"type": "http.response.body", "body": body})


def commands() -> None:
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["outside"]:
            for i in range(int(words[1])):
                hip.hipLaunchKernel(HANDLES["vector_add"], Dim3(1, 1, 1), Dim3(1, 1, 1), None, 0, None)
            print("outside done", file=sys.stderr, flush=True)


def main() -> None:
    kind, port = sys.argv[1], int(sys.argv[2])
    load(sys.argv[3])
    if kind == "stdlib":
        server = ThreadingHTTPServer(("127.0.0.1", port), Handler)
        port = server.server_address[1]
    print(f"listening on {port}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    register()
    threading.Thread(target=commands, daemon=True).start()
    if kind == "stdlib":
        server.serve_forever()
    else:
        import uvicorn
        uvicorn.run(asgi_app, host="127.0.0.1", port=port, log_level="warning", lifespan="off")


if __name__ == "__main__":
    main()
