"""Item 20: device-clock mode, the collector's side (issue 46): what tying the device's records
to their calls costs the collector, and that every one is tied once. The bpf tier's
device-clock service (tests/bpf/targets/device_clock_http.py: real libcudart calls, the real
libotel_gpu_cupti.so over the FAKE CUPTI, which makes each call's record on the calling
thread: no GPU here) under bench.load's 16 keep-alive clients, each request 3 launches and a copy
(4 records), in two phases: the collector with its flag file (the library on, records tied) and
without (the library off; the collector still knows the process maps it). Figures: records a second, the collector's
CPU per 1,000 records over the phase without, and records tied == the calls made (an exact
count: a record tied twice, or lost, is a miss). The library's own cost per launch is a GPU's
to measure (bench/items/gpu_launch_cost.py)."""
from __future__ import annotations

import sys
import time
from pathlib import Path

from otel_gpu.device_clock import library

from ..collector import Collector
from ..native import BUILD
from ..target import Service

TARGET = Path(__file__).resolve().parents[2] / "tests" / "bpf" / "targets" / "device_clock_http.py"
# step_us: the fake device times a request's work 200 us apart (the tests' 10 ms would make
# each request last 30 ms, and the collector's share too small to see).
PATH, PER_REQUEST = "/infer/1?launches=3&copies=1&step_us=200", 4
CONNS = 16


def _phase(svc: Service, flag: str | None, seconds: float) -> dict:
    col = Collector(env={"OTEL_GPU_DEVICE_CLOCK_FLAG": flag or ""})
    try:
        col.wait_traced(svc.pid)
        time.sleep(1.5)  # the library looks for the flag once a second
        svc.get(PATH)  # the first request after a start is not measured
        cpu0 = col.cpu_seconds()
        load = svc.load(seconds, conns=CONNS, path=PATH)
        time.sleep(1.0)  # the last records: the library flushes every 0.1 s
        cpu = col.cpu_seconds() - cpu0
    finally:
        summary = col.stop()
    return {"requests": load["ok"], "errors": load["errors"], "seconds": seconds,
            "cpu_s": cpu, "tied": summary.get("counted", {}).get("device_tied") if summary else None,
            "untied": {k: v for k, v in summary.get("dropped", {}).items() if k.startswith("device_")}
            if summary else None}


def run(quick: bool, starts: list) -> dict:
    seconds = 10 if quick else 20
    lib, fake = library.build(BUILD / "cupti"), library.build_fake(BUILD / "cupti")
    flag = str(BUILD / "cupti" / "device-clock")
    svc = Service(argv=[sys.executable, str(TARGET)],
                  env={"DEVICE_CLOCK_LIBRARY": str(lib), "OTEL_GPU_CUPTI_LIB": str(fake),
                       "OTEL_GPU_DEVICE_CLOCK_FLAG": flag})
    try:
        on = _phase(svc, flag, seconds)
        off = _phase(svc, None, seconds)
    finally:
        svc.stop()
    return {"on": on, "off": off, "per_request": PER_REQUEST, "conns": CONNS}


def rows(r: dict) -> list:
    on, off = r["on"], r["off"]
    made = (on["requests"] + 1) * r["per_request"]  # with the unmeasured first request
    records_s = on["requests"] * r["per_request"] / on["seconds"]
    per_k = None
    if on["requests"] and off["requests"]:
        added = on["cpu_s"] / on["requests"] - off["cpu_s"] / off["requests"]  # CPU-s per request
        per_k = added / r["per_request"] * 1000
    return [
        ("20", f"device-clock mode, collector side: {r['conns']} clients, {r['per_request']} records a request "
               f"(fake CUPTI): records a second; requests with / without the library on",
         f"{records_s:.0f}; {on['requests']} / {off['requests']}", "", None),
        ("20", "  records tied to their calls == calls made (untied, by why)",
         f"{on['tied']} of {made} {on['untied'] or ''}".strip(), "== made", on["tied"] == made),
        ("20", "  collector CPU-s per 1,000 records, over the phase without them (CPU ms a request: on / off)",
         "n/a" if per_k is None else f"{per_k:.3f} ({1e3 * on['cpu_s'] / max(on['requests'], 1):.2f} / "
                                     f"{1e3 * off['cpu_s'] / max(off['requests'], 1):.2f})", "", None),
    ]
