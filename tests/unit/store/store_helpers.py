"""Spans shaped like export/spans.py makes them: a SERVER span carrying the GPU
summary, with one child per CUDA call (or rollup), explicit ids and epoch-ns times."""
from __future__ import annotations

import argparse
import io

from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.trace import Link, SpanContext, SpanKind, Status, StatusCode, TraceFlags

from otel_gpu import semconv as sc
from otel_gpu.store.commands import add_parsers, dispatch

KERNEL = "vector_add(float const*, float*, int)"
T0 = 1_700_000_000_000_000_000  # a fixed epoch ns: tests pass `now_ns` explicitly
MS = 1_000_000


def ctx(trace_id: int, span_id: int, remote: bool = False, sampled: bool = True) -> SpanContext:
    return SpanContext(trace_id, span_id, is_remote=remote,
                       trace_flags=TraceFlags(TraceFlags.SAMPLED if sampled else TraceFlags.DEFAULT))


def request(trace_id: int, start: int, duration: int, *, service="demo", route="/infer/{id}", method="POST",
            status=200, launches=2, copies=((4096, "h2d"), (1024, "d2h")), gpu_seconds=None, cost=None,
            currency="USD", feature=None, kernel=KERNEL, rollup=0, resource_extra=None,
            server_extra=None, sampled=True) -> list[ReadableSpan]:
    """`sampled`: the trace's flag (an unsampled request the store sums unless it ended in an error)."""
    res = Resource({sc.SERVICE_NAME: service, sc.PROCESS_PID: 4242, **(resource_extra or {})})
    server_ctx = ctx(trace_id, trace_id * 1000 + 1, sampled=sampled)
    kids = []
    t = start + 10
    for i in range(launches):
        kids.append(("cudaLaunchKernel", {sc.GPU_CUDA_CALL: "cudaLaunchKernel", sc.GPU_KERNEL_NAME: kernel,
                                          sc.GPU_GRID: [4, 1, 1], sc.GPU_BLOCK: [256, 1, 1],
                                          sc.GPU_TIMING: "host_enqueue"}))
    for nbytes, direction in copies:
        kids.append(("cudaMemcpy", {sc.GPU_CUDA_CALL: "cudaMemcpy", sc.GPU_MEMCPY_BYTES: nbytes,
                                    sc.GPU_MEMCPY_DIRECTION: direction, sc.GPU_TIMING: "host_enqueue"}))
    if rollup:
        kids.append((f"cudaLaunchKernel x{rollup}", {sc.GPU_CUDA_CALL: "cudaLaunchKernel",
                                                     sc.GPU_ROLLUP_COUNT: rollup, sc.GPU_KERNEL_NAME: kernel}))
    spans = []
    for i, (name, attrs) in enumerate(kids):
        s = t + i * 100
        spans.append(ReadableSpan(name=name, context=ctx(trace_id, trace_id * 1000 + 2 + i, sampled=sampled),
                                  parent=server_ctx,
                                  resource=res, attributes=attrs, kind=SpanKind.INTERNAL, start_time=s,
                                  end_time=s + 50))
    attrs = {sc.HTTP_REQUEST_METHOD: method, sc.HTTP_ROUTE: route, sc.URL_PATH: route,
             sc.HTTP_RESPONSE_STATUS_CODE: status, sc.PROCESS_PID: 4242,
             sc.GPU_CALLS: len(kids), sc.GPU_LAUNCHES: launches + rollup,
             sc.GPU_MEMCPY_H2D_BYTES: sum(b for b, d in copies if d == "h2d"),
             sc.GPU_MEMCPY_D2H_BYTES: sum(b for b, d in copies if d == "d2h"),
             sc.GPU_MEMCPY_D2D_BYTES: sum(b for b, d in copies if d == "d2d"),
             sc.GPU_MEMCPY_OTHER_BYTES: 0, sc.GPU_SYNC_DURATION_NS: 7, sc.GPU_CALLS_AMBIGUOUS: 0}
    if gpu_seconds is not None:
        attrs[sc.GPU_COST_SECONDS] = gpu_seconds
    if cost is not None:
        attrs[sc.GPU_COST_AMOUNT] = cost
        attrs[sc.GPU_COST_CURRENCY] = currency
    if feature is not None:
        attrs[sc.GPU_FEATURE] = feature
    attrs.update(server_extra or {})
    server = ReadableSpan(name=f"{method} {route}", context=server_ctx, parent=ctx(trace_id, 99, remote=True),
                          resource=res, attributes=attrs, kind=SpanKind.SERVER,
                          status=Status(StatusCode.ERROR) if status >= 500 else Status(StatusCode.UNSET),
                          start_time=start, end_time=start + duration)
    return [server] + spans


def window(trace_id: int, start: int, launches: int = 1, service="demo", gpu_seconds=None, cost=None,
           split=None) -> list[ReadableSpan]:
    """An INTERNAL root for GPU work outside any request, with launch children; with
    `split` [(trace_id, span_id, seconds, feature)], an ambiguous one linked to those
    candidates. Cost attributes as the span builder writes them after the cost stage."""
    res = Resource({sc.SERVICE_NAME: service, sc.PROCESS_PID: 4242})
    root_ctx = ctx(trace_id, trace_id * 1000 + 1)
    attrs = {sc.GPU_ATTRIBUTION: "ambiguous" if split else "outside", sc.GPU_LAUNCHES: launches}
    if gpu_seconds is not None:
        attrs.update({sc.GPU_COST_SECONDS: gpu_seconds, sc.GPU_COST_AMOUNT: cost or 0.0,
                      sc.GPU_COST_CURRENCY: "USD"})
    links = [Link(ctx(t, s)) for t, s, _, _ in split or ()]
    if split:
        attrs[sc.GPU_COST_SPLIT_SECONDS] = [sec for *_, sec, _ in split]
        attrs[sc.GPU_COST_SPLIT_FEATURES] = [f for *_, f in split]
    root = ReadableSpan(name="GPU work outside requests" if not split else "GPU work, ambiguous request",
                        context=root_ctx, resource=res, attributes=attrs, links=links,
                        kind=SpanKind.INTERNAL, start_time=start, end_time=start + MS)
    kids = [ReadableSpan(name="cudaLaunchKernel", context=ctx(trace_id, trace_id * 1000 + 2 + i), parent=root_ctx,
                         resource=res, attributes={sc.GPU_KERNEL_NAME: "outside_kernel(int)"},
                         kind=SpanKind.INTERNAL, start_time=start + i, end_time=start + i + 5)
            for i in range(launches)]
    return [root] + kids


def run_cli(*argv: str) -> tuple[int, str]:
    """Parses argv the way the otel-gpu CLI will (subparsers from add_parsers)."""
    parser = argparse.ArgumentParser(prog="otel-gpu")
    add_parsers(parser.add_subparsers(dest="command", required=True))
    out = io.StringIO()
    code = dispatch(parser.parse_args(list(argv)), out=out)
    return code, out.getvalue()
