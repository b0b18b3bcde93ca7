"""`python -m bench.gpu_http [--seconds S] [--json FILE]`: on a GPU host, requests/s of
a PyTorch model behind FastAPI/uvicorn (tests/gpu/fastapi_server.py, GET /predict: one
eager forward of a small model, synchronised) under 8 keep-alive clients: untraced, traced
(a collector exporting OTLP/gRPC to a counting receiver), untraced again, on one server
process. Prints loss, the collector's CPU, spans against requests and lost events; the
issue's throughput target (<= 2 % on a GPU) is the row. Needs root, a GPU, PyTorch, bcc
(scripts/gpu-tier.sh --bench runs it on a bare GPU machine)."""
from __future__ import annotations

import argparse
import json
import sys
import time
from collections import Counter
from pathlib import Path

from .collector import Collector
from .receiver import CountingReceiver
from .target import Service

ROOT = Path(__file__).resolve().parents[1]
SERVER = ROOT / "tests" / "gpu" / "fastapi_server.py"
CONNS = 8
LOSS_TARGET_PCT = 2.0


def measure(seconds: float) -> dict:
    svc, rx = Service(argv=[sys.executable, str(SERVER)]), CountingReceiver().start()
    out: dict = {"seconds": seconds, "conns": CONNS}
    try:
        svc.load(3, conns=CONNS, path="/predict")  # warm-up: worker threads, cuBLAS handles
        out["untraced"] = svc.load(seconds, conns=CONNS, path="/predict")
        col = Collector(otlp_endpoint=rx.endpoint)
        try:
            col.wait_traced(svc.pid)
            svc.load(2, conns=CONNS, path="/predict")
            rx.reset(since_ns=time.time_ns())
            cpu0, t0 = col.cpu_seconds(), time.monotonic()
            out["traced"] = svc.load(seconds, conns=CONNS, path="/predict")
            out["collector_cores"] = (col.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            out["collector_rss_mb"] = col.rss_mb()
            time.sleep(3)  # the last batch (200 ms delay here) and the backlog, if any
            out["server_spans"], out["spans"] = len(rx.servers), rx.span_count
            launches = Counter(a.get("gpu.launches", 0) for a in rx.servers.values())
            out["launches_per_request"] = dict(sorted(launches.items()))  # launches -> requests
        finally:
            out["collector"] = col.stop()
        out["untraced_after"] = svc.load(seconds, conns=CONNS, path="/predict")
    finally:
        svc.stop()
        rx.stop()
    base = (out["untraced"]["rps"] + out["untraced_after"]["rps"]) / 2
    out["loss_pct"] = 100 * (1 - out["traced"]["rps"] / base)
    out["cores_per_krps"] = out["collector_cores"] / max(out["traced"]["rps"] / 1000, 1e-9)
    out["lost_events"] = Collector.lost_events(out["collector"])
    return out


def report(r: dict) -> str:
    met = "yes" if r["loss_pct"] <= LOSS_TARGET_PCT else "NO"
    return "\n".join([
        f"gpu_http: FastAPI + PyTorch, {r['conns']} clients, {r['seconds']} s per phase",
        f"  req/s untraced {r['untraced']['rps']:.0f}, traced {r['traced']['rps']:.0f}, "
        f"untraced after {r['untraced_after']['rps']:.0f}",
        f"  throughput loss {r['loss_pct']:+.1f} % (target <= {LOSS_TARGET_PCT} %: {met})",
        f"  collector {r['collector_cores']:.2f} cores, {r['cores_per_krps']:.2f} cores per 1000 req/s, "
        f"RSS {r['collector_rss_mb']:.0f} MB",
        f"  server spans {r['server_spans']} of {r['traced']['ok']} requests, spans {r['spans']}, "
        f"requests by launches {r['launches_per_request']}, lost events {r['lost_events']}",
    ])


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench.gpu_http", description=__doc__)
    ap.add_argument("--seconds", type=float, default=10)
    ap.add_argument("--json", type=Path, help="also write the figures here")
    a = ap.parse_args()
    r = measure(a.seconds)
    print(report(r), flush=True)
    if a.json:
        a.json.write_text(json.dumps(r, indent=1, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())
