"""Item 8: no blind start. A CUDA HTTP server (tests/bpf/targets/cuda_http.py) is
started after the collector, and requests (2 launches each, one at a time, at most
MAX_REQUESTS) go to it for the first WINDOW_S after it listens, with no wait for the
collector: requests with an exact server span (gpu.launches == 2, 2 children) /
requests sent. Cases: the wheel's libcudart (probed ahead, default mode) on the stdlib
and the uvicorn server; --exe (per-process probes, attached at the load probe's scan);
and a libcudart copy at a path no probe knows (found by the periodic /proc scan). Each
row also gives when the collector's scan (prompt or periodic) logged the process."""
from __future__ import annotations

import datetime
import shutil
import time

from otel_gpu.demo.cuda_work import find_cudart
from tests.bpf.targets.first_requests import send_first_requests, start_server
from tests.support.counting_receiver import CountingReceiver

from ..collector import Collector
from ..native import BUILD

WINDOW_S = 1.0
MAX_REQUESTS = 5000  # a bound only: about 300 one-at-a-time requests fit in WINDOW_S here
LAUNCHES = 2
NAME = "otelgpu-bench8"


def _wheel_cudart() -> str:
    """The wheel's own file (bench/native/ points OTEL_GPU_CUDART at a private copy)."""
    import os
    saved = os.environ.pop("OTEL_GPU_CUDART", None)
    try:
        return find_cudart()
    finally:
        if saved is not None:
            os.environ["OTEL_GPU_CUDART"] = saved


def _case(rx: CountingReceiver, kind: str, cudart: str, args: tuple, starts: list) -> dict:
    rx.reset()
    col = Collector(otlp_endpoint=rx.endpoint, args=args)
    starts.append(col.ready_s)
    try:
        t0 = time.time()
        server = start_server(kind, NAME if "--exe" in args else "", {"OTEL_GPU_CUDART": cudart})
        try:
            sent = send_first_requests(server, [f"/work?launches={LAUNCHES}"] * MAX_REQUESTS, WINDOW_S)
            col.wait_traced(server.pid, 30)
            traced_s = _logged_at(col, f"tracing pid {server.pid}") - t0
            deadline = time.monotonic() + 10
            while time.monotonic() < deadline and _exact(rx, server.pid)[0] < sent:
                time.sleep(0.2)
            exact, spans = _exact(rx, server.pid)
        finally:
            server.stop()
    finally:
        col.stop()
    return {"kind": kind, "args": list(args), "cudart": cudart, "sent": sent, "exact_spans": exact,
            "server_spans": spans, "traced_after_s": traced_s}


def _logged_at(col: Collector, text: str) -> float:
    """time.time() of the collector's first log line containing `text` (its timestamp)."""
    line = next(l for l in col.log.lines if text in l)
    return datetime.datetime.strptime(line[:23], "%Y-%m-%d %H:%M:%S,%f").timestamp()


def _exact(rx: CountingReceiver, pid: int) -> tuple[int, int]:
    with rx.lock:
        mine = [(sid, a) for sid, a in rx.servers.items() if a.get("process.pid") == pid]
    exact = sum(1 for sid, a in mine if a.get("gpu.launches") == LAUNCHES and rx.children_of(sid)[0] == LAUNCHES)
    return exact, len(mine)


def run(quick: bool, starts: list) -> dict:
    wheel = _wheel_cudart()
    fresh = BUILD / "first-requests" / f"{int(time.time())}" / "libcudart.so.12"
    fresh.parent.mkdir(parents=True, exist_ok=True)
    shutil.copyfile(wheel, fresh)
    rx = CountingReceiver().start()
    try:
        cases = {"stdlib": _case(rx, "stdlib", wheel, (), starts),
                 "asgi": _case(rx, "asgi", wheel, (), starts),
                 "exe": _case(rx, "stdlib", wheel, ("--exe", NAME), starts),
                 "new_path": _case(rx, "stdlib", str(fresh), (), starts)}
    finally:
        rx.stop()
        shutil.rmtree(fresh.parent, ignore_errors=True)
    return {"window_s": WINDOW_S, "launches_per_request": LAUNCHES, "cases": cases}


def rows(r: dict) -> list:
    what = {"stdlib": "default mode, stdlib server", "asgi": "default mode, uvicorn server",
            "exe": "--exe, stdlib server", "new_path": "libcudart at a new path, stdlib server"}
    out = []
    for key, c in r["cases"].items():
        ok = c["exact_spans"] == c["sent"] if key in ("stdlib", "asgi") else None
        out.append(("8", f"first {r['window_s']:.0f} s after a server starts, {what[key]}: requests with exact "
                         f"spans / sent (scanned {c['traced_after_s']:.2f} s after start)",
                    f"{c['exact_spans']}/{c['sent']}", "= sent" if ok is not None else "", ok))
    return out
