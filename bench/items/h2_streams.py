"""Item 16: HTTP/2 multiplexed, the kernel's frame walk (bpf/h2_walk.c). hypercorn's ASGI
app of the tests (tests/bpf/targets/h2_apps.py: 6 real libcudart calls a request, 10 ms
asleep in the middle) gets batches of STREAMS requests at once, each batch on one new
h2c connection (tests/support/h2_client.py), for the phase's seconds: untraced, traced
by a default collector, untraced again. Figures: req/s of each phase; the requests the
collector finished against those answered (exact: `==`, a double count misses); the
collector's BPF programs' runs and run time per request (h2_walk, tail-called, counts in
the read and write exits that call it), from a dedicated batch with
kernel.bpf_stats_enabled=1, never during the timed phases."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from tests.bpf.targets.h2_shape import CALLS
from tests.support.h2_client import h2_get_all

from .. import bpfstats
from ..collector import Collector
from ..target import Service

TARGETS = Path(__file__).resolve().parents[2] / "tests" / "bpf" / "targets"
STREAMS = 32
MAX_BATCHES = 2_000


def _batches(port: int, seconds: float) -> dict:
    """Batches of STREAMS requests until `seconds` (or MAX_BATCHES) are spent; one at least."""
    answered, t0, n = 0, time.monotonic(), 0
    while n == 0 or (time.monotonic() - t0 < seconds and n < MAX_BATCHES):
        got = h2_get_all(port, [f"/infer?id={1 + i}" for i in range(STREAMS)], timeout=30)
        answered += sum(1 for _, status in got.values() if status == 200)
        n += 1
    wall = time.monotonic() - t0
    return {"answered": answered, "batches": n, "rps": answered / wall}


def run(quick: bool, starts: list) -> dict:
    seconds = 3 if quick else 8
    svc = Service(argv=[sys.executable, str(TARGETS / "h2_apps.py"), "asgi", "0"])
    try:
        time.sleep(1)  # hypercorn listens once its loop runs
        _batches(svc.port, 1)  # warm-up
        out: dict = {"streams": STREAMS, "seconds": seconds, "calls_per_request": CALLS,
                     "before": _batches(svc.port, seconds)}
        col = Collector()
        starts.append(col.ready_s)
        try:
            col.wait_traced(svc.pid)
            time.sleep(1)  # h2_walk is installed once verified, beside the attach
            warm = _batches(svc.port, 1)
            out["traced"] = _batches(svc.port, seconds)
            with bpfstats.enabled():
                s0 = bpfstats.snapshot(col.pid)
                one = _batches(svc.port, 0)  # one batch
                s1 = bpfstats.snapshot(col.pid)
            # Every program of the collector: h2_walk is tail-called, and a tail call's time
            # counts in its caller's (the read and write exits'), not under its own name.
            runs = bpfstats.delta(s0, s1)
            out["bpf"] = {"requests": one["answered"], "runs": sum(c for _, c, _ in runs),
                          "run_ns": sum(t for _, _, t in runs)}
            out["answered_while_traced"] = warm["answered"] + out["traced"]["answered"] + one["answered"]
            time.sleep(2)  # the last batch's spans go out
        finally:
            summary = col.stop()
        out["requests_finished"] = summary.get("requests")  # None: it left no final state
        out["dropped"] = summary.get("dropped")
        out["after"] = _batches(svc.port, seconds)
    finally:
        svc.stop()
    base = (out["before"]["rps"] + out["after"]["rps"]) / 2
    out["loss"] = 1 - out["traced"]["rps"] / base if base else None
    return out


def rows(r: dict) -> list:
    b = r["bpf"]
    exact = r["requests_finished"] == r["answered_while_traced"]
    return [
        ("16", f"HTTP/2, {r['streams']} streams a connection (hypercorn): req/s without/with/without the collector",
         f"{r['before']['rps']:.0f}/{r['traced']['rps']:.0f}/{r['after']['rps']:.0f} ({r['loss']:+.1%} lost)",
         "", None),
        ("16", "  requests the collector finished / answered while traced (==)",
         f"{r['requests_finished']} / {r['answered_while_traced']}", "==", exact),
        ("16", "  BPF program runs and run time per request (us; h2_walk's inside the exits': tail-called)",
         f"{b['runs'] / max(b['requests'], 1):.1f}, {b['run_ns'] / max(b['requests'], 1) / 1000:.1f}", "", None),
    ]
