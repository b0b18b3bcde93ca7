"""Spans of a request that made NCCL calls and launched a CUDA graph, built from pipeline
records by the real span builder (export/spans.py), as the collector hands them to the store."""
from __future__ import annotations

import random

from opentelemetry.sdk.resources import Resource

from otel_gpu.clock import BpfClock
from otel_gpu.export.spans import SpanBuilder
from otel_gpu.pipeline.model import CallSink, Request
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.records import NcclCall
from otel_gpu.cuda_calls import BY_NAME
from tests.unit.pipeline.calls import cuda

PID, TID = 4343, 4344
GEMM, RELU = "gemm(float const*, float*)", "relu(float*)"
COMM = 0xC0FFEE
FLOAT32, BFLOAT16, SUM, NO_OP = 7, 9, 0, 0xFFFFFFFF  # ncclDataType_t / ncclRedOp_t codes (probes/nccl.py)


def nccl(name: str, ts: int, nbytes: int, datatype=FLOAT32, redop=SUM, peer=-1, nranks=4, rank=1):
    spec = BY_NAME[name]
    size = 2 if datatype == BFLOAT16 else 4
    return NcclCall(PID, TID, ts, spec.id, 0, nbytes // size, nbytes, datatype, redop, peer, COMM, nranks, rank,
                    0x5, 0)


def graph_launch(ts: int, kernels=((0x1000, 3), (0x2000, 1))):
    g = cuda("cudaGraphLaunch", tid=TID, func=0x77, pid=PID, ts=ts, stream=0x5)
    g.kernels = kernels
    return g


def request_spans(trace_id: int, start_ns: int, route: str = "/train/{id}", calls=None):
    """[server span, children...] of one request whose calls are `calls` (default: an
    all_reduce of 1 MiB, a send of 4 KiB to rank 2, a broadcast from root 0 and one graph
    launch of gemm x3 + relu x1). BpfClock is anchored so span times are epoch ns near start_ns."""
    sink = CallSink(64)
    t = 1_000
    for c in calls if calls is not None else (
            nccl("ncclAllReduce", t + 100, 1 << 20), nccl("ncclSend", t + 200, 4096, redop=NO_OP, peer=2),
            nccl("ncclBroadcast", t + 300, 512, datatype=BFLOAT16, redop=NO_OP, peer=0),
            graph_launch(t + 400)):
        sink.add(c, "thread")
    r = Request(PID, TID, 9, RequestHead("POST", route.replace("{id}", "7"), "1.1", {}), t, trace_id=trace_id,
                span_id=trace_id * 1000 + 1, sink=sink, end_ns=t + 900_000, status=200)
    r.resource = Resource({"service.name": "trainer", "process.pid": PID})
    r.route = route
    r.kernel_names = {0x1000: GEMM, 0x2000: RELU}
    clock = BpfClock()
    clock.offset_ns = start_ns - t  # epoch = monotonic + offset
    return SpanBuilder(clock, ids=random.Random(trace_id)).build(r)
