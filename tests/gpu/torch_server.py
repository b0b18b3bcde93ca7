"""PyTorch serving a small model over HTTP (stdlib server), for the gpu tier.
GET /predict runs one eager forward pass on the GPU and synchronises.
GET /profile runs the same pass under torch.profiler and returns its count of
kernel launches (cudaLaunchKernel + cuLaunchKernel*) as JSON."""
from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import torch

MODEL = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                            torch.nn.Linear(512, 10), torch.nn.Softmax(dim=-1)).cuda().eval()
X = torch.randn(32, 256, device="cuda")


def forward() -> None:
    with torch.no_grad():
        MODEL(X)
    torch.cuda.synchronize()


def profiled_launches() -> int:
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        forward()
    names = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")
    return sum(e.count for e in prof.key_averages() if e.key in names)


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        if self.path == "/predict":
            forward()
            body = b"{}"
        elif self.path == "/profile":
            body = json.dumps({"launches": profiled_launches()}).encode()
        else:
            body = b"{}"
        self.send_response(200)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    forward()  # warm up: lazy module loading and cuBLAS handles happen outside requests
    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    server.serve_forever()
