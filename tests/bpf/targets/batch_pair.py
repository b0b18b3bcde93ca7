"""A front-end + GPU-worker pair for the bpf tier, as batching engines are built (vLLM's
API server and engine core, SGLang's server and scheduler): two processes.

  front-end (this file, no CUDA): a stdlib ThreadingHTTPServer; GET /gen/<id> hands <id>
      to the worker over a pipe and answers once the worker says it is done.
  worker (this file with "worker", real libcudart): batches the ids that have arrived
      (up to 4, waiting a few ms for more), and per batch step k makes LAUNCHES
      cudaLaunchKernel calls with grid (k, 1, 1) and one cudaDeviceSynchronize, prints
      "step <k> ids <id> <id> ..." to stderr (shared with the front-end), then reports
      every id of the batch done.

The front-end prints "listening on PORT worker PID" to stderr once the worker has
libcudart loaded, then waits for a line on stdin before serving."""
from __future__ import annotations

import os
import select
import subprocess
import sys
import threading
import time

LAUNCHES = 3
MAX_BATCH = 4
GATHER_S = 0.004  # how long a step waits for more ids once one is in
STEP_S = 0.003    # as if the GPU were busy before the synchronize returns


def worker() -> None:
    from otel_gpu.demo.cuda_work import CudaWork
    work = CudaWork()
    out = os.fdopen(1, "w", buffering=1)
    out.write("ready\n")
    buf, step = b"", 0

    def ids_in(b: bytes) -> tuple[list[str], bytes]:
        *lines, rest = b.split(b"\n")
        return [l.decode() for l in lines if l], rest

    while True:
        chunk = os.read(0, 4096)
        if not chunk:
            return
        batch, buf = ids_in(buf + chunk)
        deadline = time.monotonic() + GATHER_S
        while len(batch) < MAX_BATCH and (left := deadline - time.monotonic()) > 0:
            if not select.select([0], [], [], left)[0]:
                break
            chunk = os.read(0, 4096)
            if not chunk:
                break
            more, buf = ids_in(buf + chunk)
            batch += more
        while batch:
            step += 1
            now, batch = batch[:MAX_BATCH], batch[MAX_BATCH:]
            for _ in range(LAUNCHES):
                work.launch("matmul_tile", (step, 1, 1), (32, 1, 1))
            time.sleep(STEP_S)
            work.synchronize()
            print(f"step {step} ids {' '.join(now)}", file=sys.stderr, flush=True)
            for i in now:
                out.write(f"done {i}\n")


def front_end(port: int) -> None:
    from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

    proc = subprocess.Popen([sys.executable, __file__, "worker"], stdin=subprocess.PIPE, stdout=subprocess.PIPE)
    assert proc.stdout.readline() == b"ready\n"
    waiting: dict[str, threading.Event] = {}
    lock = threading.Lock()

    def replies() -> None:
        for line in proc.stdout:
            with lock:
                ev = waiting.pop(line.split()[1].decode(), None)
            if ev:
                ev.set()
    threading.Thread(target=replies, daemon=True).start()

    class H(BaseHTTPRequestHandler):
        protocol_version = "HTTP/1.1"

        def log_message(self, *a):
            pass

        def do_GET(self):
            if self.path.startswith("/gen/"):
                rid, ev = self.path[5:], threading.Event()
                with lock:
                    waiting[rid] = ev
                    proc.stdin.write(f"{rid}\n".encode())
                    proc.stdin.flush()
                status, body = (200, b"ok") if ev.wait(20) else (504, b"timeout")
            else:
                status, body = 404, b"not found"
            self.send_response(status)
            self.send_header("Content-Length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

    server = ThreadingHTTPServer(("127.0.0.1", port), H)
    print(f"listening on {server.server_address[1]} worker {proc.pid}", file=sys.stderr, flush=True)
    sys.stdin.readline()  # the test says go once the collector traces both
    try:
        server.serve_forever()
    finally:
        proc.kill()


if __name__ == "__main__":
    if sys.argv[1] == "worker":
        worker()
    else:
        front_end(int(sys.argv[1]))
