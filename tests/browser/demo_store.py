"""A demo-like local store made from synthetic spans shaped as export/spans.py makes them
(SERVER span with its GPU summary, one child per CUDA call with its attribution and
thread, window traces for ambiguous/shared/outside work), written by the real
StoreExporter. The browser tests and scripts/screenshots.py read it."""
from __future__ import annotations

import random

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_gpu import semconv as sc
from otel_gpu.export.spans import WINDOW_NAMES
from otel_gpu.store.exporter import StoreExporter

T0 = 1_795_435_200 * 10**9  # 2026-11-23 12:00:00 UTC
US = 1000
MS = 1_000_000
PRICE_PER_HOUR = 2.5
KERNELS = {
    "matmul": "matmul_tile(float const*, float const*, float*, int)",
    "layernorm": "layernorm_kernel(float const*, float*, int)",
    "softmax": "softmax_kernel(float*, int)",
    "embed": "embedding_gather(long const*, float const*, float*, int)",
    "decode": "decode_step(half const*, half*, int)",
}
INFERENCE_PID, ASYNC_PID, WORKER_PID = 4242, 5151, 6161


def _ctx(trace_id: int, span_id: int) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=False, trace_flags=TraceFlags(TraceFlags.SAMPLED))


def _res(service: str, pid: int) -> Resource:
    return Resource({sc.SERVICE_NAME: service, sc.PROCESS_PID: pid})


def launch(kernel: str, grid, block) -> tuple:
    return ("cudaLaunchKernel", {sc.GPU_KERNEL_NAME: KERNELS[kernel], sc.GPU_GRID: list(grid),
                                 sc.GPU_BLOCK: list(block), sc.GPU_STREAM: "0x0"}, 2 * US)


def copy(nbytes: int, direction: str) -> tuple:
    return ("cudaMemcpy", {sc.GPU_MEMCPY_BYTES: nbytes, sc.GPU_MEMCPY_DIRECTION: direction}, 6 * US)


def sync(duration_ns: int) -> tuple:
    return ("cudaDeviceSynchronize", {}, duration_ns)


class DemoStore:
    def __init__(self, path: str) -> None:
        self.exporter = StoreExporter(path, now_ns=lambda: T0 + 3600 * 10**9)
        self.rng = random.Random(7)
        self.requests: list[dict] = []  # what was written, for the tests to compare with

    def _ids(self) -> tuple[int, int]:
        return self.rng.getrandbits(128) | 1, self.rng.getrandbits(64) | 1

    def _calls(self, trace_id, parent_ctx, res, calls, start, tid, attribution, gap=40 * US):
        spans, t = [], start
        for name, attrs, dur, *on in calls:  # on: (thread, attribution) of a call made elsewhere
            call_tid, how = on[0] if on else (tid, attribution)
            a = {sc.GPU_CUDA_CALL: name, sc.GPU_TIMING: "host_enqueue", sc.GPU_ATTRIBUTION: how,
                 sc.THREAD_ID: call_tid, **attrs}
            spans.append(ReadableSpan(name=name, context=_ctx(trace_id, self.rng.getrandbits(64) | 1),
                                      parent=parent_ctx, resource=res, attributes=a, kind=SpanKind.INTERNAL,
                                      start_time=t, end_time=t + dur))
            t += dur + gap
        return spans, t

    def request(self, service, pid, tid, method, route, start, calls, *, status=200, call_tid=None,
                attribution="thread", tail=300 * US, lead=200 * US) -> dict:
        trace_id, span_id = self._ids()
        res = _res(service, pid)
        kids, t = self._calls(trace_id, _ctx(trace_id, span_id), res, calls, start + lead, call_tid or tid, attribution)
        end = t + tail
        busy = sum(c[2] for c in calls) / 1e9
        launches = sum(1 for c in calls if c[0] == "cudaLaunchKernel")
        by_dir = {d: sum(c[1].get(sc.GPU_MEMCPY_BYTES, 0) for c in calls if c[1].get(sc.GPU_MEMCPY_DIRECTION) == d)
                  for d in ("h2d", "d2h")}
        attrs = {sc.HTTP_REQUEST_METHOD: method, sc.HTTP_ROUTE: route, sc.URL_PATH: route,
                 sc.HTTP_RESPONSE_STATUS_CODE: status, sc.PROCESS_PID: pid, sc.THREAD_ID: tid,
                 sc.GPU_CALLS: len(calls), sc.GPU_LAUNCHES: launches, sc.GPU_MEMCPY_H2D_BYTES: by_dir["h2d"],
                 sc.GPU_MEMCPY_D2H_BYTES: by_dir["d2h"], sc.GPU_MEMCPY_D2D_BYTES: 0, sc.GPU_MEMCPY_OTHER_BYTES: 0,
                 sc.GPU_SYNC_DURATION_NS: sum(c[2] for c in calls if "Synchronize" in c[0]),
                 sc.GPU_CALLS_AMBIGUOUS: 0, sc.GPU_COST_SECONDS: busy,
                 sc.GPU_COST_AMOUNT: busy * PRICE_PER_HOUR / 3600, sc.GPU_COST_CURRENCY: "USD"}
        server = ReadableSpan(name=f"{method} {route}", context=_ctx(trace_id, span_id), resource=res,
                              attributes=attrs, kind=SpanKind.SERVER,
                              status=Status(StatusCode.ERROR) if status >= 500 else Status(StatusCode.UNSET),
                              start_time=start, end_time=end)
        self.exporter.export([server] + kids)
        info = {"trace_id": f"{trace_id:032x}", "span_id": f"{span_id:016x}", "trace_int": trace_id,
                "span_int": span_id, "route": route, "service": service, "pid": pid, "tid": tid,
                "start_ns": start, "end_ns": end, "calls": len(calls), "call_tid": call_tid or tid}
        self.requests.append(info)
        return info

    def window(self, attribution, service, pid, start, calls, tids, candidates=(), split_features=()):
        trace_id, span_id = self._ids()
        res = _res(service, pid)
        kids, t, = [], start + 50 * US
        for tid, call in zip(tids, calls):
            more, t = self._calls(trace_id, _ctx(trace_id, span_id), res, [call], t, tid, attribution)
            kids += more
        busy = sum(c[2] for c in calls) / 1e9
        attrs = {sc.PROCESS_PID: pid, sc.GPU_ATTRIBUTION: attribution, sc.GPU_LAUNCHES: len(calls),
                 sc.GPU_COST_SECONDS: busy, sc.GPU_COST_AMOUNT: busy * PRICE_PER_HOUR / 3600,
                 sc.GPU_COST_CURRENCY: "USD"}
        links = [Link(_ctx(c["trace_int"], c["span_int"])) for c in candidates]
        if candidates:
            attrs[sc.GPU_CANDIDATE_REQUESTS] = len(candidates)
            attrs[sc.GPU_COST_SPLIT_SECONDS] = [busy / len(candidates)] * len(candidates)
            attrs[sc.GPU_COST_SPLIT_FEATURES] = list(split_features)
        root = ReadableSpan(name=WINDOW_NAMES[attribution], context=_ctx(trace_id, span_id), resource=res,
                            attributes=attrs, links=links, kind=SpanKind.INTERNAL, start_time=start,
                            end_time=t + 50 * US)
        self.exporter.export([root] + kids)
        return f"{trace_id:032x}"

    def close(self) -> None:
        self.exporter.shutdown()


INFER = [copy(65536, "h2d"), launch("matmul", (64, 64, 1), (16, 16, 1)), launch("matmul", (64, 64, 1), (16, 16, 1)),
         launch("layernorm", (256, 1, 1), (256, 1, 1)), launch("softmax", (256, 1, 1), (128, 1, 1)),
         copy(4096, "d2h"), sync(120 * US)]
EMBED = [copy(2048, "h2d"), launch("embed", (128, 1, 1), (256, 1, 1)), copy(2048, "d2h"), sync(40 * US)]
GENERATE = [copy(8192, "h2d")] + [launch("decode", (32, 1, 1), (128, 1, 1))] * 6 + [copy(512, "d2h"), sync(300 * US)]


def build_demo_store(path: str, minutes: int = 10) -> dict:
    """Writes the demo store; returns what the tests check against: the requests, the
    slowest request's trace id, the window trace ids by kind."""
    d = DemoStore(path)
    s = 10**9
    windows = {"ambiguous": [], "shared": [], "outside": []}
    for i in range(minutes * 6):  # every 10 s; load grows, then falls
        t = T0 + i * 10 * s
        busy = 1 + (i % 12 < 6) * (i % 6)
        for k in range(busy):
            d.request("demo-inference", INFERENCE_PID, INFERENCE_PID + 1 + k % 2, "POST", "/infer/{id}",
                      t + k * 30 * MS, INFER)
        if i % 2 == 0:
            d.request("demo-inference", INFERENCE_PID, INFERENCE_PID + 3, "POST", "/embed", t + 5 * MS, EMBED)
        if i % 3 == 0:
            d.request("demo-inference", INFERENCE_PID, INFERENCE_PID + 3, "GET", "/health", t + 400 * MS, [])
        if i % 4 == 1:  # an asyncio server: two requests open at once on the loop thread, GPU work in a worker
            a = d.request("demo-async", ASYNC_PID, ASYNC_PID, "POST", "/v1/generate", t + 600 * MS, GENERATE,
                          call_tid=ASYNC_PID + 9, attribution="task", lead=500 * US)
            b = d.request("demo-async", ASYNC_PID, ASYNC_PID, "POST", "/v1/generate", t + 600 * MS + 900 * US,
                          GENERATE, call_tid=ASYNC_PID + 9, attribution="task", lead=300 * US)
            windows["shared"].append(d.window("shared", "demo-worker", WORKER_PID, t + 600 * MS + 1000 * US,
                                              [launch("decode", (64, 1, 1), (128, 1, 1))] * 3, [WORKER_PID] * 3,
                                              candidates=(a, b), split_features=("/v1/generate",) * 2))
        if i % 6 == 5:
            windows["outside"].append(d.window("outside", "demo-inference", INFERENCE_PID, t + 800 * MS,
                                               [launch("layernorm", (256, 1, 1), (256, 1, 1))] * 2,
                                               [INFERENCE_PID] * 2))
    # The slowest request: a large batch, two launches handed to a worker thread while it was
    # the only request open (attribution process), and an ambiguous window once a second
    # request overlapped it.
    t = T0 + (minutes * 60 - 95) * s
    worker = (INFERENCE_PID + 5, "process")
    slow_calls = [copy(4 * 1024 * 1024, "h2d"), (*launch("embed", (512, 1, 1), (256, 1, 1)), worker),
                  (*launch("embed", (512, 1, 1), (256, 1, 1)), worker)] + [
        launch("matmul", (128, 128, 1), (16, 16, 1))] * 8 + [
        launch("layernorm", (1024, 1, 1), (256, 1, 1)), launch("softmax", (1024, 1, 1), (128, 1, 1)),
        copy(262144, "d2h"), sync(9 * MS)]
    slow = d.request("demo-inference", INFERENCE_PID, INFERENCE_PID + 1, "POST", "/infer/{id}", t, slow_calls,
                     tail=2 * MS, lead=1 * MS)
    other = d.request("demo-inference", INFERENCE_PID, INFERENCE_PID + 2, "POST", "/infer/{id}", t + 2 * MS, INFER)
    windows["ambiguous"].append(d.window("ambiguous", "demo-inference", INFERENCE_PID, t + 3 * MS,
                                         [launch("softmax", (512, 1, 1), (128, 1, 1))] * 2, [INFERENCE_PID + 7] * 2,
                                         candidates=(slow, other), split_features=("/infer/{id}",) * 2))
    d.close()
    return {"requests": d.requests, "slowest": slow, "windows": windows}
