"""An HTTP service that captures a CUDA graph at warm-up and replays it, through stub
libraries (no GPU here): STUB_LIBCUDA (stub_libcuda_graphs.c, loaded RTLD_GLOBAL: the
driver's graph calls) and STUB_CUDART (stub_cudart_graphs.c: the runtime's, each going
on to the driver's, as libcudart does). After "go", outside any request:

  capture on stream S: gemm_tile x3, relu x1 on S (recorded, not run), copy_side x1 on
  stream OTHER (runs now); end capture, instantiate, destroy the graph (the exec keeps
  it), then REPLAYS graph launches

and then serves

  /graph       two graph launches
  /graph/<n>   n graph launches, then copy_side launched on its own with grid (n, 1, 1)

Prints "listening on PORT" to stderr, then waits for a line on stdin; prints "warm" to
stderr once the warm-up is done."""
from __future__ import annotations

import ctypes as ct
import os
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

S, OTHER = 0x5100, 0x5200
REPLAYS = 5
vp, u = ct.c_void_p, ct.c_uint
drv = ct.CDLL(os.environ["STUB_LIBCUDA"], mode=ct.RTLD_GLOBAL)
rt = ct.CDLL(os.environ["STUB_CUDART"])


class Dim3(ct.Structure):
    _fields_ = [("x", u), ("y", u), ("z", u)]


rt.cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, vp, ct.c_size_t, vp]
rt.cudaStreamBeginCapture.argtypes = [vp, ct.c_int]
rt.cudaStreamEndCapture.argtypes = [vp, ct.POINTER(vp)]
rt.cudaGraphInstantiate.argtypes = [ct.POINTER(vp), vp, ct.c_ulonglong]
rt.cudaGraphLaunch.argtypes = [vp, vp]
rt.cudaGraphDestroy.argtypes = [vp]


def launch(kernel: str, stream: int) -> None:
    assert rt.cudaLaunchKernel(ct.cast(getattr(rt, kernel), vp), Dim3(8, 1, 1), Dim3(64, 1, 1), None, 0,
                               vp(stream)) == 0


def warm_up() -> int:
    assert rt.cudaStreamBeginCapture(vp(S), 0) == 0
    for _ in range(3):
        launch("_Z9gemm_tilePfi", S)
    launch("_Z4reluPfi", S)
    launch("_Z9copy_sidePfi", OTHER)
    graph, graph_exec = vp(0), vp(0)
    assert rt.cudaStreamEndCapture(vp(S), ct.byref(graph)) == 0 and graph.value
    assert rt.cudaGraphInstantiate(ct.byref(graph_exec), graph, 0) == 0 and graph_exec.value
    assert rt.cudaGraphDestroy(graph) == 0
    for _ in range(REPLAYS):
        assert rt.cudaGraphLaunch(graph_exec, vp(S)) == 0
    return graph_exec.value


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"
    graph_exec = 0

    def log_message(self, *a):
        pass

    def do_GET(self):
        status, body = 404, b"not found"
        parts = self.path.split("/")
        if parts[1:2] == ["graph"] and len(parts) <= 3:
            n = int(parts[2]) if len(parts) == 3 else 2
            for _ in range(n):
                rt.cudaGraphLaunch(vp(self.graph_exec), vp(S))
            if len(parts) == 3:
                assert rt.cudaLaunchKernel(ct.cast(rt._Z9copy_sidePfi, vp), Dim3(n, 1, 1), Dim3(64, 1, 1), None, 0,
                                           vp(OTHER)) == 0
            status, body = 200, b"ok"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    H.graph_exec = warm_up()
    print("warm", file=sys.stderr, flush=True)
    server.serve_forever()
