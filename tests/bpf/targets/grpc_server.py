"""A grpcio server whose handlers make real libcudart calls that encode the RPC they
are made for. Generic handlers over raw bytes (no generated code):

  /demo.Inference/Predict   unary; request b"ID": 2 x cudaLaunchKernel
                            with grid (ID, 1, 1), then one cudaMemcpy of ID bytes; reply b"ok"
  /demo.Inference/Stream    server streaming; request b"ID": 3 messages, one launch with
                            grid (ID, 1, 1) before each, then one cudaMemcpy of ID bytes
  /demo.Inference/Fail      unary; one launch with grid (ID, 1, 1), then aborts with
                            INTERNAL (gRPC status 13)

  python grpc_server.py [PORT] [--aio] [--pause-ms MS]    (PORT 0 or none: any free port)
The default is grpcio's thread-pool server: C-core reads the socket on its own threads,
handlers run on a ThreadPoolExecutor. --aio: grpc.aio, handlers are coroutines on one
asyncio loop (each RPC a task). Binds, prints "listening on PORT" to stderr, waits for a
line on stdin, then serves. --pause-ms: the pause after each launch (default 1 ms), longer
where a test needs many RPCs open at once on a loaded machine."""
from __future__ import annotations

import argparse
import asyncio
import sys
import time
from concurrent import futures
from pathlib import Path

import grpc

ROOT = Path(__file__).resolve().parents[3]
if str(ROOT) not in sys.path:
    sys.path.insert(0, str(ROOT))

from otel_gpu.demo.cuda_work import H2D, CudaWork, Dim3  # noqa: E402

WORK = CudaWork()
KERNEL = WORK.kernel_address("matmul_tile")
BLOCK = Dim3(64, 1, 1)
SERVICE = "demo.Inference"
UNARY_LAUNCHES, STREAM_MESSAGES = 2, 3


def _args() -> argparse.Namespace:
    parser = argparse.ArgumentParser()
    parser.add_argument("port", nargs="?", type=int, default=0)
    parser.add_argument("--aio", action="store_true")
    parser.add_argument("--pause-ms", type=float, default=1.0)
    return parser.parse_args()


ARGS = _args()
PAUSE_S = ARGS.pause_ms / 1000  # lets concurrent RPCs interleave


def launch(rid: int) -> None:
    WORK.rt.cudaLaunchKernel(KERNEL, Dim3(rid, 1, 1), BLOCK, None, 0, None)
    time.sleep(PAUSE_S)


def predict(request: bytes, context) -> bytes:
    rid = int(request)
    for _ in range(UNARY_LAUNCHES):
        launch(rid)
    WORK.memcpy(rid, H2D)
    return b"ok"


def stream(request: bytes, context):
    rid = int(request)
    for i in range(STREAM_MESSAGES):
        launch(rid)
        yield b"part%d" % i
    WORK.memcpy(rid, H2D)


def fail(request: bytes, context) -> bytes:
    launch(int(request))
    context.abort(grpc.StatusCode.INTERNAL, "failed on purpose")


async def predict_aio(request: bytes, context) -> bytes:
    rid = int(request)
    for _ in range(UNARY_LAUNCHES):
        await launch_aio(rid)
    WORK.memcpy(rid, H2D)
    return b"ok"


async def stream_aio(request: bytes, context):
    rid = int(request)
    for i in range(STREAM_MESSAGES):
        await launch_aio(rid)
        yield b"part%d" % i
    WORK.memcpy(rid, H2D)


async def fail_aio(request: bytes, context) -> bytes:
    await launch_aio(int(request))
    await context.abort(grpc.StatusCode.INTERNAL, "failed on purpose")


async def launch_aio(rid: int) -> None:
    WORK.rt.cudaLaunchKernel(KERNEL, Dim3(rid, 1, 1), BLOCK, None, 0, None)
    await asyncio.sleep(PAUSE_S)


def _handlers(predict_fn, stream_fn, fail_fn):
    return (grpc.method_handlers_generic_handler(SERVICE, {
        "Predict": grpc.unary_unary_rpc_method_handler(predict_fn),
        "Stream": grpc.unary_stream_rpc_method_handler(stream_fn),
        "Fail": grpc.unary_unary_rpc_method_handler(fail_fn)}),)


def _address() -> str:
    return f"127.0.0.1:{ARGS.port}"


def main() -> None:
    server = grpc.server(futures.ThreadPoolExecutor(max_workers=16))
    server.add_generic_rpc_handlers(_handlers(predict, stream, fail))
    port = server.add_insecure_port(_address())
    print(f"listening on {port}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    server.start()
    print("serving", file=sys.stderr, flush=True)
    server.wait_for_termination()


async def main_aio() -> None:
    server = grpc.aio.server()
    server.add_generic_rpc_handlers(_handlers(predict_aio, stream_aio, fail_aio))
    port = server.add_insecure_port(_address())
    print(f"listening on {port}", file=sys.stderr, flush=True)
    await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
    await server.start()
    print("serving", file=sys.stderr, flush=True)
    await server.wait_for_termination()


if __name__ == "__main__":
    if ARGS.aio:
        asyncio.run(main_aio())
    else:
        main()
