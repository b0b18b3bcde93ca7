"""Collector CPU per request in its Python pipeline alone (issue 26 item 3), with none of
the kernel, ring buffer or other processes sharing the CPU: the stages as
otel_gpu/wiring.py builds them (stitcher, enrich on this process's real /proc entry,
metrics through an in-memory reader, cost, spans for an OTLP destination, which drops
unsampled traces before they are built), fed the records of item 2's HTTP service as the
kernel hands them: keep-alive connections, each request a head read, its 100 launches (over
`--kernels` distinct kernels, one count each) and 2 copies counted in the kernel (one
AggregateRun, as the reader places them), its response write; both socket records carry
their thread's time sums (bpf/thread_times.c, on by default), so each request is split.
`python -m bench.pipeline_speed [--ratio 0.1] [--requests 20000] [--in-flight 1]
[--per-poll 16] [--kernels 1] [--gc-defaults] [--store]` (--store: the local store beside
OTLP, in a temporary file) prints µs of this thread's CPU per request, best of 3 runs (the
figure is noisy on a shared machine), with the interpreter's garbage collector set as the
collector's loop sets it (otel_gpu/gc_policy.py) or left at CPython's thresholds."""
from __future__ import annotations

import argparse
import os
import tempfile
import time

from opentelemetry.sdk.metrics.export import InMemoryMetricReader
from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

from otel_gpu import gc_policy
from otel_gpu.clock import BpfClock
from otel_gpu.config import Config
from otel_gpu.cuda_calls import call_id
from otel_gpu.export.destinations import Destinations, QueuedExporter
from otel_gpu.ratelimit import Stats
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, Accept, AggregateRun, CallAggregate, SockIo, Tick
from otel_gpu.store.exporter import StoreExporter
from otel_gpu.wiring import build_pipeline

PID = os.getpid()  # a live process: enrich reads its /proc entry as it would the service's
CONNS = 8
PER_POLL = 16  # requests per pipeline batch (a poll's worth at ~2,000 req/s; ~1,700 behind a load)
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
LAUNCH, MEMCPY = call_id("cudaLaunchKernel"), call_id("cudaMemcpy")
LAUNCHES = 100  # a request's launches (item 2's /work)
H2D, D2H = 1, 2  # cudaMemcpyKind


class Names:
    """Kernel names without reading the (synthetic) function addresses' ELF symbols."""

    def __call__(self, pid, func):
        return f"kernel_{func:x}"

    def forget(self, pid):
        pass


def _times(i: int, conns: int, answered: int) -> tuple:
    """The serving thread's sums (on_cpu, cpu_wait, gpu_sync, blocked; ns) at request i's
    head read, or at its answer: they only grow, by 1 µs from each record to the next."""
    n = i // conns * 2 + answered
    return (n * 700, n * 50, n * 100, n * 150)


def _counts(tid: int, epoch: int, ts: int, kernels: int) -> AggregateRun:
    """A request's counts as the reader places them: its 100 launches over `kernels`
    distinct kernels (one req_agg entry each), then its two copies."""
    launches = [CallAggregate(PID, tid, epoch, LAUNCH, 0x1000 + 16 * k, 0,
                              LAUNCHES // kernels + (k < LAUNCHES % kernels), 0, 0, ts + 10 + k, ts + 500, ts + 500)
                for k in range(kernels)]
    copies = [CallAggregate(PID, tid, epoch, MEMCPY, H2D, 0, 1, 4096, 1000, ts + 5, ts + 5, ts + 1005),
              CallAggregate(PID, tid, epoch, MEMCPY, D2H, 0, 1, 4096, 1000, ts + 600, ts + 600, ts + 1600)]
    return AggregateRun(PID, tid, epoch, 0, False, sorted(launches + copies, key=lambda a: a.ts_ns))


def batches(n: int, in_flight: int = 1, per_poll: int = PER_POLL, t0: int = 10**12, kernels: int = 1) -> list:
    """The records of n requests, `per_poll` requests a batch, round-robin on CONNS connections
    (or `in_flight`, if more): `in_flight` requests at a time read their heads, make their
    calls, then are answered newest first (1: one request at a time, in order)."""
    conns = max(CONNS, in_flight)
    out = [[Accept(PID, 100 + c, t0, 10 + c, 3, "127.0.0.1", 5000 + c) for c in range(conns)]]
    epoch, ts, batch = 0, t0, []
    for first in range(0, n, in_flight):
        group = range(first, min(first + in_flight, n))
        for i in group:
            head = f"GET /work?id={i} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            epoch, ts = epoch + 1, ts + 1000
            batch.append(SockIo(EV_SOCK_READ, PID, 100 + i % conns, ts, 10 + i % conns, len(head), head, b"",
                                epoch=epoch, req_start=True, times=_times(i, conns, 0)))
        for i in group:
            batch.append(_counts(100 + i % conns, epoch, ts, kernels))
        for i in reversed(group):
            epoch, ts = epoch + 1, ts + 1000
            batch.append(SockIo(EV_SOCK_WRITE, PID, 100 + i % conns, ts, 10 + i % conns, len(OK), OK, OK[-8:],
                                epoch=epoch, times=_times(i, conns, 1)))
        if first // per_poll != (group[-1] + 1) // per_poll or group[-1] == n - 1:  # a poll's worth
            out.append(batch + [Tick(ts)])  # the flush timer's records come between polls
            batch = []
    return out


def run(ratio: str, n: int, in_flight: int = 1, per_poll: int = PER_POLL, store: bool = False,
        kernels: int = 1) -> float:
    """µs of this thread's CPU per request through a fresh pipeline."""
    stats = Stats()
    folder = tempfile.TemporaryDirectory()
    exporters = [("store", StoreExporter(os.path.join(folder.name, "otel-gpu.db"), stats=stats))] if store else []
    wiring = build_pipeline(
        Config(traces_sampler="traceidratio", traces_sampler_arg=ratio), stats,
        destinations=Destinations(exporters + [("otlp", QueuedExporter(InMemorySpanExporter(), stats))], stats),
        metric_readers=[InMemoryMetricReader()], kernel_names=Names(), clock=BpfClock())
    records = batches(n, in_flight, per_poll, kernels=kernels)
    t0 = time.thread_time()
    for batch in records:
        wiring.pipeline.push(batch)
    us = (time.thread_time() - t0) / n * 1e6
    assert stats.snapshot().get("requests_finished") == n, stats.snapshot()
    wiring.destinations.shutdown(time.monotonic() + 5)
    folder.cleanup()
    return us


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ratio", default="0.1", help="OTEL_TRACES_SAMPLER_ARG (traceidratio)")
    ap.add_argument("--requests", type=int, default=20000)
    ap.add_argument("--in-flight", type=int, default=1,
                    help="requests open at once, answered newest first (a busy server's order)")
    ap.add_argument("--per-poll", type=int, default=PER_POLL, help="requests per pipeline batch")
    ap.add_argument("--kernels", type=int, default=1, help="distinct kernels among a request's 100 launches")
    ap.add_argument("--gc-defaults", action="store_true", help="CPython's garbage collector thresholds")
    ap.add_argument("--store", action="store_true", help="the local store beside OTLP (a temporary file)")
    a = ap.parse_args()
    if not a.gc_defaults:
        gc_policy.set_for_the_loop()
    best = min(run(a.ratio, a.requests, a.in_flight, a.per_poll, a.store, a.kernels) for _ in range(3))
    print(f"pipeline: {best:.1f} µs of collector CPU per request at {float(a.ratio):.0%} sampling, "
          f"{a.in_flight} in flight, batches of {a.per_poll}, {a.kernels} distinct kernels a request, garbage collector "
          f"{'at CPython defaults' if a.gc_defaults else 'as the collector sets it'}"
          f"{', with the local store' if a.store else ''} (best of 3 x {a.requests} requests)")


if __name__ == "__main__":
    main()
