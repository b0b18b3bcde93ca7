"""Item 1 breakdown: where otel-gpu's per-launch cost goes. Loads the cumulative
handler steps of bench/native/launch_variants.c (a measurement copy of
cuda_launch_kernel) with bcc, attaches one at a time to cudaLaunchKernel and times
the same C loop: thread CPU ns per launch (best of the reps: this machine is
shared, and the minimum is the least disturbed), and the BPF program's own run time
(kernel.bpf_stats_enabled). The ring-buffer consumer is a no-op callback."""
from __future__ import annotations

import ctypes as ct
import threading
import time

from otel_gpu.demo.cuda_work import find_cudart
from otel_gpu.probes.source import ProgramOptions, bpf_dir, kernel_headers_hint
from otel_gpu.cuda_calls import c_defines

from .. import bpfstats
from ..native import HERE as NATIVE, LaunchLoop

VARIANTS = [  # (handler, streams through the ring buffer, what it adds)
    ("v_empty", False, "uprobe trap + empty program"),
    ("v_admit", False, "+ pid, traced lookup, ktime, registers"),
    ("v_stack", False, "+ 2 stack reads (shmem, stream)"),
    ("v_remember", False, "+ last_rt_launch update (driver dedup)"),
    ("v_full", False, "+ counter, http_active, rollup + 3 atomics = product, outside"),
    ("v_full_no_remember", False, "product outside, without the dedup update"),
    ("v_full_percpu", False, "product outside, per-CPU rollup (no atomics)"),
    ("v_lean", False, "no dedup update + per-CPU rollup"),
    ("v_stream", True, "product inside a request (ring buffer, wakeup)"),
    ("v_stream_no_wakeup", True, "inside, BPF_RB_NO_WAKEUP"),
]


def _consume(bpf, stop: threading.Event) -> None:
    """Drains without waiting for wakeups (BPF_RB_NO_WAKEUP sends none): every 5 ms."""
    bpf["events"].open_ring_buffer(lambda ctx, data, size: 0)
    while not stop.is_set():
        bpf.ring_buffer_consume()
        time.sleep(0.005)


def _measure(bpf, fn: str, stream: bool, iters: int, reps: int) -> dict:
    lib = find_cudart().encode()
    bpf.attach_uprobe(name=lib, sym=b"cudaLaunchKernel", fn_name=fn.encode())
    try:
        full0 = sum(bpf["counters"][ct.c_int(0)])
        timed = LaunchLoop("--iters", str(iters), "--reps", str(reps))
        bpf["traced"][ct.c_uint32(timed.pid)] = ct.c_uint32(1)
        if stream:
            bpf["http_active"][ct.c_uint32(timed.pid)] = ct.c_int64(1)
        timed.go()
        res = timed.result()
        with bpfstats.enabled():
            before = bpfstats.snapshot_self()
            extra = LaunchLoop("--iters", str(iters), "--reps", "1")
            bpf["traced"][ct.c_uint32(extra.pid)] = ct.c_uint32(1)
            extra.go()
            extra.result()
            ran = bpfstats.delta(before, bpfstats.snapshot_self())
    finally:
        bpf.detach_uprobe(name=lib, sym=b"cudaLaunchKernel")
    prog = max(ran, key=lambda r: r[1], default=("?", 0, 0))
    return {"cpu_ns": min(res["cpu_reps"]), "cpu_reps": res["cpu_reps"], "prog_ns": prog[2] / max(prog[1], 1),
            "ringbuf_full": sum(bpf["counters"][ct.c_int(0)]) - full0}


def _untraced(iters: int, reps: int) -> float:
    loop = LaunchLoop("--iters", str(iters), "--reps", str(reps))
    loop.go()
    return min(loop.result()["cpu_reps"])


def run(quick: bool) -> dict:
    from bcc import BPF
    kernel_headers_hint()
    text = c_defines() + (bpf_dir() / "maps.h").read_text() + (NATIVE / "launch_variants.c").read_text()
    bpf = BPF(text=text.encode(), cflags=ProgramOptions(trace_all=False).cflags())
    iters, reps = (50_000, 3) if quick else (200_000, 5)
    stop = threading.Event()
    consumer = threading.Thread(target=_consume, args=(bpf, stop), daemon=True)
    consumer.start()
    out = {"iters": iters, "reps": reps}
    try:
        out["untraced_cpu_ns"] = _untraced(iters, reps)
        out["variants"] = [dict(name=fn, adds=what, **_measure(bpf, fn, stream, iters, reps))
                           for fn, stream, what in VARIANTS]
        out["untraced_after_cpu_ns"] = _untraced(iters, reps)
    finally:
        stop.set()
        consumer.join(5)
        bpf.cleanup()
    return out


def rows(r: dict) -> list:
    base = (r["untraced_cpu_ns"] + r["untraced_after_cpu_ns"]) / 2
    return [("1b", "breakdown baseline: untraced thread CPU ns/launch, best rep (before, after)",
             f"{r['untraced_cpu_ns']:.1f}, {r['untraced_after_cpu_ns']:.1f}", "", None)] + [("1b", f"{v['name']}: {v['adds']}",
             f"+{v['cpu_ns'] - base:.0f} ns (prog {v['prog_ns']:.0f} ns)"
             + (f", ringbuf full {v['ringbuf_full']}" if v["ringbuf_full"] else ""), "", None)
            for v in r["variants"]]
