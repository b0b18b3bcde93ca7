"""Item 12: many GPU processes at once (issue 13 item 2's second rate). PROCS launch_loop
processes, each inside one long HTTP request of its own (open for its whole loop, so the
requests are concurrent), each paced to RATE launches/s for 20 s (3 s quick): the same
load untraced, traced (OTLP to the counting receiver), untraced again. Per process:
launches made vs the request's server span `gpu.launches` (streamed calls + the kernel's
per-request counts past the stream budget/rate: exact equality is the target); ring-buffer
losses, the collector's mean CPU and its RSS, and the loops' achieved rate traced vs
untraced (this machine may not reach PROCS x RATE: what it reaches is reported)."""
from __future__ import annotations

import shutil
import tempfile
import time
from pathlib import Path

from otel_gpu import semconv
from otel_gpu.status.file import read_state
from tests.support.counting_receiver import CountingReceiver

from ..collector import Collector, known
from ..native import LaunchLoop

PROCS, RATE = 8, 30_000
CPU_TARGET = 0.5  # cores


def _loops(seconds: int) -> list:
    return [LaunchLoop("--threads", "1", "--rate", str(RATE), "--seconds", str(seconds), http=True,
                       path=f"/rates/{i}") for i in range(PROCS)]


def _run(loops: list, seconds: int) -> list:
    for loop in loops:
        loop.go()
    return [loop.result(timeout=seconds + 120) for loop in loops]


def _rates(results: list) -> dict:
    per = [r["launched"] / r["seconds"] for r in results]
    return {"launched": [r["launched"] for r in results], "per_process": per, "total": sum(per),
            "responses": [r.get("response") for r in results]}


def _untraced(seconds: int) -> dict:
    return _rates(_run(_loops(seconds), seconds))


def _traced(seconds: int, starts: list) -> dict:
    rx = CountingReceiver().start()
    status = Path(tempfile.mkdtemp(prefix="otel-gpu-bench-")) / "status.json"
    try:
        # Its counters are read from its status file while it runs: on a loaded host the stop
        # (uprobe detach) can outlast Collector.stop's wait, and the `stopped:` line with it.
        col = Collector(otlp_endpoint=rx.endpoint, args=("--status-file", str(status)))
        starts.append(col.ready_s)
        try:
            loops = _loops(seconds)
            for loop in loops:
                col.wait_traced(loop.pid)
            time.sleep(1.0)  # the scans after `tracing pid` are done before the load
            cpu0, t0 = col.cpu_seconds(), time.monotonic()
            out = _rates(_run(loops, seconds))
            time.sleep(1.0)  # let the collector drain what is queued
            out["collector_cores"] = (col.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            out["rss_mb"] = col.rss_mb()
            paths = [loop.path for loop in loops]
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline and not all(rx.server_span(p) for p in paths):
                time.sleep(0.5)
            spans = [(rx.server_span(p) or (None, {}))[1] for p in paths]
            out["counted"] = [s.get(semconv.GPU_LAUNCHES) for s in spans]
            out["ambiguous"] = [s.get(semconv.GPU_CALLS_AMBIGUOUS, 0) for s in spans]
            out["counters"] = _counters_after(status, time.time())
        finally:
            out_col = col.stop()
    finally:
        rx.stop()
        shutil.rmtree(status.parent, ignore_errors=True)
    out["collector"], out["collector_stop_s"] = out_col, col.stop_s
    # None: neither a status file written after the load nor a `stopped:` line was read: not known
    counters = out["counters"] if out["counters"] is not None else out_col.get("dropped")
    out["lost_events"] = None if counters is None else counters.get("lost_events", 0)
    out["exact"] = sum(c == n for c, n in zip(out["counted"], out["launched"]))
    return out


def _counters_after(status: Path, since: float, timeout: float = 15) -> dict | None:
    """The collector's counters from its status file, once rewritten after `since` (every 2 s)."""
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        try:
            state = read_state(str(status))
            if state.get("written_at", 0) > since:
                return state.get("counters", {})
        except (OSError, ValueError):
            pass
        time.sleep(0.5)
    return None


def run(quick: bool, starts: list) -> dict:
    seconds = 3 if quick else 20
    return {"seconds": seconds, "procs": PROCS, "rate_target": RATE,
            "untraced": _untraced(seconds), "traced": _traced(seconds, starts),
            "untraced_after": _untraced(seconds)}


def rows(r: dict) -> list:
    t, u, ua = r["traced"], r["untraced"], r["untraced_after"]
    n, target = r["procs"], r["procs"] * r["rate_target"]
    pairs = ", ".join(f"{c}/{m}" for c, m in zip(t["counted"], t["launched"]))
    return [
        ("12", f"{n} processes x {r['rate_target']} launches/s, each in its own open request, {r['seconds']} s: "
               "achieved launches/s untraced, traced, untraced again",
         f"{u['total']:.0f}, {t['total']:.0f}, {ua['total']:.0f}", f"~{target}", None),
        ("12", "  per process: gpu.launches on its server span / launches made", pairs, "all equal",
         t["exact"] == n),
        ("12", "  calls counted ambiguous (all processes)", f"{sum(t['ambiguous']):g}", "0",
         sum(t["ambiguous"]) == 0),
        ("12", "  events lost (ring buffer full)",
         known(t["lost_events"], "no status or `stopped:` line read"), "0",
         t["lost_events"] == 0),
        ("12", "  collector CPU (cores, mean over the load)", f"{t['collector_cores']:.2f}", f"<= {CPU_TARGET}",
         t["collector_cores"] <= CPU_TARGET),
        ("12", "  collector VmRSS after the load (MB)", f"{t['rss_mb']:.0f}", "<= 120", t["rss_mb"] <= 120),
    ]
