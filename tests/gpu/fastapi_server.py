"""The gpu tier's model behind FastAPI on uvicorn (a `def` endpoint: FastAPI runs it in
an anyio worker thread, as model servers commonly do).
GET /predict: one eager forward; GET /profile: its torch.profiler launch counts."""
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


@app.get("/profile")
def profile() -> dict:
    return gpu_model.profiled("eager")


if __name__ == "__main__":
    gpu_model.eager()
    sock = socket.socket()
    sock.bind(("127.0.0.1", 0))
    print(f"listening on {sock.getsockname()[1]}", file=sys.stderr, flush=True)
    sys.stdin.readline()
    config = uvicorn.Config(app, log_level="warning", lifespan="off", loop="asyncio")
    uvicorn.Server(config).run(sockets=[sock])
