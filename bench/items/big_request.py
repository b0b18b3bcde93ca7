"""Item 5: one request doing 10,000 launches: its server span counts every launch
(gpu.launches) and has at most --span-budget single children plus rollups."""
from __future__ import annotations

import time

from otel_gpu import semconv
from tests.support.counting_receiver import CountingReceiver

from ..collector import Collector
from ..target import Service

LAUNCHES, BUDGET = 10_000, 256


def run(quick: bool, starts: list) -> dict:
    svc, rx = Service(), CountingReceiver().start()
    path = f"/launch/{LAUNCHES}"
    try:
        col = Collector(otlp_endpoint=rx.endpoint)
        starts.append(col.ready_s)
        try:
            col.wait_traced(svc.pid)
            status = svc.get(path)
            deadline = time.monotonic() + 30
            while time.monotonic() < deadline and not rx.server_span(path):
                time.sleep(0.5)
        finally:
            out = {"collector": col.stop()}
        time.sleep(1.0)
    finally:
        svc.stop()
        rx.stop()
    span_id, attrs = rx.server_span(path) or (None, {})
    singles, rollups = rx.children_of(span_id) if span_id else (0, 0)
    out.update(status=status, found=span_id is not None, launches=attrs.get(semconv.GPU_LAUNCHES),
               rolled_up=attrs.get(semconv.GPU_SPANS_DROPPED), single_children=singles,
               rollup_children=rollups)
    return out


def rows(r: dict) -> list:
    return [
        ("5", f"{LAUNCHES}-launch request: gpu.launches on the server span", str(r["launches"]),
         str(LAUNCHES), r["launches"] == LAUNCHES),
        ("5", "  children: single / rollup", f"{r['single_children']} / {r['rollup_children']}",
         f"<= {BUDGET} / few", r["single_children"] <= BUDGET and r["rollup_children"] <= 8),
    ]
