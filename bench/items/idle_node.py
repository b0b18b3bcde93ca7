"""Item 19: the collector's CPU on an idle node (issue 45, item 2: at most 0.005 cores with
300 processes). One traced GPU service (bench/http_service.py, real libcudart) that gets
no request, beside IDLE_PYTHON idle Python interpreters and IDLE_OTHER idle `sleep`
processes (the node's daemons, sidecars and shells: what the collector's periodic scan
reads), and the collector in its default mode. After it traced the service and SETTLE_S
passed, its CPU seconds over the measured window; then what one scan costs, from the
same window (scans every --scan-interval, 2 s by default)."""
from __future__ import annotations

import subprocess
import sys
import time

from otel_gpu.config import Config
from otel_gpu.demo.runner import stop_process

from ..collector import Collector
from ..target import Service

IDLE_PYTHON, IDLE_OTHER = 200, 100
SETTLE_S = 5
TARGET_CORES = 0.005


def run(quick: bool, starts: list) -> dict:
    window = 10 if quick else 30
    svc = Service()
    idle = [subprocess.Popen([sys.executable, "-c", "import time; time.sleep(86400)"]) for _ in range(IDLE_PYTHON)]
    idle += [subprocess.Popen(["sleep", "86400"]) for _ in range(IDLE_OTHER)]
    try:
        col = Collector()
        starts.append(col.ready_s)
        try:
            col.wait_traced(svc.pid)
            time.sleep(SETTLE_S)
            cpu0, t0 = col.cpu_seconds(), time.monotonic()
            time.sleep(window)
            cores = (col.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            rss = col.rss_mb()
        finally:
            col.stop()
    finally:
        for p in idle:
            p.kill()
        for p in idle:
            stop_process(p, timeout=10)
        svc.stop()
    scans = window / Config().scan_interval_s
    return {"processes": IDLE_PYTHON + IDLE_OTHER + 1, "window_s": window, "cores": round(cores, 5),
            "ms_per_scan": round(cores * window / scans * 1000, 2), "rss_mb": round(rss, 1)}


def rows(r: dict) -> list:
    return [("19", f"idle node: collector cores with one traced service and {r['processes'] - 1} idle processes "
                   f"({r['window_s']} s; {r['ms_per_scan']} ms of CPU a scan if the scans were all of it; "
                   f"RSS {r['rss_mb']} MB)", f"{r['cores']:.4f}", f"<= {TARGET_CORES}", r["cores"] <= TARGET_CORES)]
