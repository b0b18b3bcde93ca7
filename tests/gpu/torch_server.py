"""PyTorch serving a small model over HTTP (stdlib server), for the gpu tier.
GET /run/<mode>      one run of tests/gpu/gpu_model.py's eager | compiled | graph
GET /profile/<mode>  the same run under torch.profiler: its launch counts, as JSON
GET /decode/<steps>  a decode-like loop of eager forwards: its wall seconds, as JSON
GET /launches/<n>    n one-launch additions: their wall seconds, as JSON
GET /wait/<ms>       the GPU busy ~ms, then a synchronize: its seconds, as JSON
GET /shape/<shape>   one run of gpu_model.SHAPES' gemm | tiny | copy | graph
GET /device/<shape>  the same under torch.profiler: the GPU's seconds on it, as JSON
GET /allreduce/<n>   one NCCL all_reduce of n float32 on a one-rank process group"""
from __future__ import annotations

import json
import sys
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import gpu_model


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        parts = self.path.strip("/").split("/")
        status, body = 200, b"{}"
        if len(parts) == 2 and parts[0] == "run" and parts[1] in gpu_model.MODES:
            gpu_model.MODES[parts[1]]()
        elif len(parts) == 2 and parts[0] == "profile" and parts[1] in gpu_model.MODES:
            body = json.dumps(gpu_model.profiled(parts[1])).encode()
        elif len(parts) == 2 and parts[0] == "shape" and parts[1] in gpu_model.SHAPES:
            gpu_model.SHAPES[parts[1]]()
        elif len(parts) == 2 and parts[0] == "device" and parts[1] in gpu_model.SHAPES:
            body = json.dumps({"seconds": gpu_model.device_seconds(parts[1])}).encode()
        elif len(parts) == 2 and parts[0] == "allreduce" and parts[1].isdigit():
            gpu_model.all_reduce(int(parts[1]))
        elif len(parts) == 2 and parts[0] == "decode" and parts[1].isdigit():
            body = json.dumps({"seconds": gpu_model.decode_loop(int(parts[1]))}).encode()
        elif len(parts) == 2 and parts[0] == "wait" and parts[1].isdigit():
            body = json.dumps({"sync_seconds": gpu_model.gpu_wait(int(parts[1]))}).encode()
        elif len(parts) == 2 and parts[0] == "launches" and parts[1].isdigit():
            body = json.dumps({"seconds": gpu_model.tiny_launches(int(parts[1]))}).encode()
        else:
            status = 404
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


if __name__ == "__main__":
    gpu_model.eager()  # lazy module loading and cuBLAS handles happen outside requests
    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    server.serve_forever()
