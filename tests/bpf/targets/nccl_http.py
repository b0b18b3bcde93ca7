"""An HTTP service that makes NCCL calls, as a tensor-parallel model server does, through
the stub libnccl.so.2 in STUB_LIBNCCL (no GPU here). After "go" on stdin it creates its
communicators (ncclCommInitRank: 4 ranks, rank 1; ncclCommInitAll over 2 devices) and
serves; every request makes calls whose counts carry its number k, so each child span
can be checked:

  /collect/{k}  all_reduce, a group of all_gather + reduce_scatter, broadcast, reduce,
                send, and a recv on a communicator whose init was never seen

A later stdin line "outside N" makes N all_reduce calls on the serving-idle process
(no request open): they must be counted, not lost. Prints "listening on PORT" first."""
from __future__ import annotations

import ctypes as ct
import os
import sys
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

UNSEEN_COMM = 0x7F00DEAD0000  # a communicator no probed init handed out
STREAM = 0x5000               # stream of request k: STREAM + k
vp, size_t, i32 = ct.c_void_p, ct.c_size_t, ct.c_int
nccl = ct.CDLL(os.environ["STUB_LIBNCCL"])
for name, args in {"ncclAllReduce": [vp, vp, size_t, i32, i32, vp, vp], "ncclAllGather": [vp, vp, size_t, i32, vp, vp],
                   "ncclReduceScatter": [vp, vp, size_t, i32, i32, vp, vp],
                   "ncclBroadcast": [vp, vp, size_t, i32, i32, vp, vp],
                   "ncclReduce": [vp, vp, size_t, i32, i32, i32, vp, vp], "ncclSend": [vp, size_t, i32, i32, vp, vp],
                   "ncclRecv": [vp, size_t, i32, i32, vp, vp], "ncclCommInitAll": [ct.POINTER(vp), i32, vp]}.items():
    getattr(nccl, name).argtypes = args


class UniqueId(ct.Structure):
    _fields_ = [("internal", ct.c_char * 128)]


nccl.ncclCommInitRank.argtypes = [ct.POINTER(vp), i32, UniqueId, i32]
COMMS: dict[str, int] = {}


def make_comms() -> None:
    a = vp()
    assert nccl.ncclCommInitRank(ct.byref(a), 4, UniqueId(), 1) == 0
    pair = (vp * 2)()
    assert nccl.ncclCommInitAll(pair, 2, None) == 0
    COMMS.update(a=a.value, b=pair[0], c=pair[1])


def collect(k: int) -> None:
    s = vp(STREAM + k)
    a, b, c = vp(COMMS["a"]), vp(COMMS["b"]), vp(COMMS["c"])
    nccl.ncclAllReduce(None, None, 1000 + k, 7, 0, a, s)          # float32, sum
    nccl.ncclGroupStart()
    nccl.ncclAllGather(None, None, 10 + k, 9, a, s)               # bfloat16
    nccl.ncclReduceScatter(None, None, 20 + k, 4, 2, b, s)        # int64, max
    nccl.ncclGroupEnd()
    nccl.ncclBroadcast(None, None, 30 + k, 1, k % 4, c, s)        # uint8, root k % 4
    nccl.ncclReduce(None, None, 40 + k, 8, 4, 2, a, s)            # float64, avg, root 2
    nccl.ncclSend(None, 50 + k, 2, 3, a, s)                       # int32 to peer 3
    nccl.ncclRecv(None, 60 + k, 6, 0, vp(UNSEEN_COMM), s)         # float16 from peer 0


class H(BaseHTTPRequestHandler):
    protocol_version = "HTTP/1.1"

    def log_message(self, *a):
        pass

    def do_GET(self):
        status, body = 404, b"not found"
        if self.path.startswith("/collect/"):
            collect(int(self.path.rsplit("/", 1)[1]))
            status, body = 200, b"ok"
        self.send_response(status)
        self.send_header("Content-Length", str(len(body)))
        self.end_headers()
        self.wfile.write(body)


def commands() -> None:
    for line in sys.stdin:
        words = line.split()
        if words[:1] == ["outside"]:
            for _ in range(int(words[1])):
                nccl.ncclAllReduce(None, None, 7, 0, 0, vp(COMMS["a"]), None)
            print("outside done", file=sys.stderr, flush=True)


if __name__ == "__main__":
    server = ThreadingHTTPServer(("127.0.0.1", 0), H)
    print(f"listening on {server.server_address[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    make_comms()
    threading.Thread(target=commands, daemon=True).start()
    server.serve_forever()
