"""A vLLM-shaped pair for the bpf tier, from real parts: a FastAPI/uvicorn front-end (no
CUDA) and an engine process it spawns (multiprocessing, spawn) doing continuous batching
over ZMQ (pyzmq, ipc://), the engine making real libcudart calls.

  GET /stream/<id>?tokens=N    SSE: the response headers at once, then one `data:` chunk
                               per token the engine makes for <id>, then `data: [DONE]`
  GET /complete/<id>?tokens=N  the same generation, answered in one response at the end

Engine: requests wait in a queue; before each step those that fit join the batch (at
most MAX_BATCH: under load requests queue); a step launches LAUNCHES kernels with grid
(step, 1, 1), waits STEP_S as if the GPU were busy, synchronises, prints "step <k> ids
<id> ..." to stderr, and sends one token to every member; a member that has its N
tokens leaves. The front-end relays each token to its client as it comes.

Runs under .venv-debian (FastAPI, uvicorn, pyzmq, the libcudart wheel). Binds, prints
"listening on PORT engine PID" to stderr once the engine has libcudart loaded, then
waits for a line on stdin before serving (tests/harness.py Target)."""
from __future__ import annotations

import asyncio
import multiprocessing
import os
import socket
import sys
import tempfile
import time
from collections import deque
from pathlib import Path

ROOT = Path(__file__).resolve().parents[3]
LAUNCHES = 2
MAX_BATCH = 4
STEP_S = 0.012  # a decode step of a small model on a real GPU takes ~10-50 ms


def engine(address: str) -> None:
    """The engine process: continuous batching, one token per member per step."""
    sys.path.insert(0, str(ROOT))
    import zmq

    from otel_gpu.demo.cuda_work import CudaWork
    work = CudaWork()
    ctx = zmq.Context()
    sock = ctx.socket(zmq.PAIR)
    sock.connect(address)
    sock.send_string("ready")
    waiting: deque = deque()
    running: dict[int, int] = {}  # id -> tokens left
    step, parent = 0, os.getppid()
    while True:
        while sock.poll(0 if (running or waiting) else 1000):
            rid, n = sock.recv_string().split()
            waiting.append((int(rid), int(n)))
        if os.getppid() != parent:  # the front-end is gone
            return
        while waiting and len(running) < MAX_BATCH:
            rid, n = waiting.popleft()
            running[rid] = n
        if not running:
            continue
        step += 1
        for _ in range(LAUNCHES):
            work.launch("matmul_tile", (step, 1, 1), (32, 1, 1))
        time.sleep(STEP_S)
        work.synchronize()
        print(f"step {step} ids {' '.join(map(str, running))}", file=sys.stderr, flush=True)
        for rid in list(running):
            running[rid] -= 1
            sock.send_string(f"{rid} {step} {'done' if not running[rid] else 'token'}")
            if not running[rid]:
                del running[rid]


def front_end(port_arg: str) -> None:
    import uvicorn
    import zmq
    import zmq.asyncio
    from fastapi import FastAPI
    from fastapi.responses import PlainTextResponse, StreamingResponse

    address = f"ipc://{tempfile.mkdtemp(prefix='engine-pair-')}/engine"
    zctx = zmq.asyncio.Context()
    sock = zctx.socket(zmq.PAIR)
    sock.bind(address)
    proc = multiprocessing.get_context("spawn").Process(target=engine, args=(address,), daemon=True)
    proc.start()
    queues: dict[int, asyncio.Queue] = {}
    app = FastAPI()

    async def relay() -> None:
        while True:
            rid, step, what = (await sock.recv_string()).split()
            q = queues.get(int(rid))
            if q is not None:
                q.put_nowait((int(step), what))

    async def generate(rid: int, tokens: int):
        q = queues[rid] = asyncio.Queue()
        await sock.send_string(f"{rid} {tokens}")
        try:
            while True:
                step, what = await q.get()
                yield step
                if what == "done":
                    return
        finally:
            queues.pop(rid, None)

    @app.get("/stream/{rid}")
    async def stream(rid: int, tokens: int = 4):
        async def events():
            async for step in generate(rid, tokens):
                yield f"data: {rid} {step}\n\n"
            yield "data: [DONE]\n\n"
        return StreamingResponse(events(), media_type="text/event-stream")

    @app.get("/complete/{rid}")
    async def complete(rid: int, tokens: int = 4):
        steps = [step async for step in generate(rid, tokens)]
        return PlainTextResponse(f"{rid} {' '.join(map(str, steps))}\n")

    async def main() -> None:
        ready = await asyncio.wait_for(sock.recv_string(), 60)
        assert ready == "ready"
        s = socket.socket()
        s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        s.bind(("127.0.0.1", int(port_arg)))
        s.listen(128)  # listening before it says so: the collector finds it as the engine's server
        print(f"listening on {s.getsockname()[1]} engine {proc.pid}", file=sys.stderr, flush=True)
        await asyncio.get_running_loop().run_in_executor(None, sys.stdin.readline)
        relaying = asyncio.create_task(relay())  # noqa: F841 (kept: the loop holds tasks weakly)
        config = uvicorn.Config(app, log_level="warning", lifespan="on")
        await uvicorn.Server(config).serve(sockets=[s])

    asyncio.run(main())


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    front_end(sys.argv[1] if len(sys.argv) > 1 else "0")
