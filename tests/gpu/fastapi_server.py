"""The gpu tier's model behind FastAPI on uvicorn (a `def` endpoint: FastAPI runs it in
an anyio worker thread, as model servers commonly do).
GET /predict            one eager forward
GET /predict/<n>        one eager forward, then n bytes copied host to device: the copy's
                        size names the request, so each child span can be checked under
                        concurrent clients
GET /profile            the eager forward's torch.profiler launch counts"""
from __future__ import annotations

import socket
import sys

import uvicorn
from fastapi import FastAPI

import gpu_model

app = FastAPI()


@app.get("/predict")
def predict() -> dict:
    gpu_model.eager()
    return {}


@app.get("/predict/{n}")
def predict_tagged(n: int) -> dict:
    gpu_model.eager()
    gpu_model.copy_in(n)
    return {}


@app.get("/profile")
def profile() -> dict:
    return gpu_model.profiled("eager")


if __name__ == "__main__":
    gpu_model.eager()
    gpu_model.copy_in(1)  # the copy path's lazy set-up happens outside requests
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"listening on {sock.getsockname()[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    config = uvicorn.Config(app, log_level="warning", lifespan="off", loop="asyncio")
    uvicorn.Server(config).run(sockets=[sock])
