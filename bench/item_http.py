"""Item 2 (and the per-request export figures of item 3): requests/s of the bench
HTTP service (100 launches + 2 copies per request) untraced, traced, untraced
again, on one service process; the traced phase exports OTLP/gRPC to a counting
receiver, and py-spy profiles the collector meanwhile."""
from __future__ import annotations

import time
from pathlib import Path

from .collector import Collector, known
from .profile import Profile
from .receiver import CountingReceiver
from .target import Service


def _settle(rx: CountingReceiver, timeout: float = 30) -> None:
    """Until the receiver's span count stops growing (the exporter batches)."""
    last, deadline = -1, time.monotonic() + timeout
    while time.monotonic() < deadline and rx.span_count != last:
        last = rx.span_count
        time.sleep(1.0)


def run(quick: bool, starts: list, results_dir: Path, stamp: str) -> dict:
    seconds = 3 if quick else 10
    out = {"seconds": seconds}
    svc, rx = Service(), CountingReceiver().start()
    try:
        svc.load(2)  # warm-up
        out["untraced"] = svc.load(seconds)
        col = Collector(otlp_endpoint=rx.endpoint)
        starts.append(col.ready_s)
        try:
            col.wait_traced(svc.pid)
            svc.load(2)  # warm-up with the probes on
            _settle(rx, 10)
            rx.reset()
            cpu0, t0 = col.cpu_seconds(), time.monotonic()
            prof = Profile(col.pid, max(seconds - 2, 1), results_dir / f"{stamp}-profile-http.txt")
            out["traced"] = svc.load(seconds)
            out["collector_cores"] = (col.cpu_seconds() - cpu0) / (time.monotonic() - t0)
            out["profile"] = prof.result()
            out["rss_mb"] = col.rss_mb()
            # The consumer's cost per request: what it finished until the receiver stopped
            # growing (its backlog drained, or not), over the CPU it spent since the load began.
            _settle(rx)
            out["settled_spans"], out["settled_cpu_s"] = len(rx.servers), col.cpu_seconds() - cpu0
        finally:
            out["collector"] = col.stop()
        _settle(rx)
        out["untraced_after"] = svc.load(seconds)
    finally:
        svc.stop()
        rx.stop()
    n = max(out["traced"]["ok"], 1)
    base = (out["untraced"]["rps"] + out["untraced_after"]["rps"]) / 2
    out["base_rps"] = base
    out["loss_pct"] = 100 * (1 - out["traced"]["rps"] / base)
    out["spans_received"], out["bytes_received"] = rx.span_count, rx.bytes
    out["server_spans"] = len(rx.servers)
    out["spans_per_request"] = rx.span_count / n
    out["bytes_per_request"] = rx.bytes / n
    out["bytes_per_span"] = rx.bytes / max(rx.span_count, 1)
    return out


def rows(r: dict) -> list:
    c = r["collector"]
    d, lost = c.get("dropped", {}), Collector.lost_events(c)
    return [
        ("2", "req/s untraced (before, after)", f"{r['untraced']['rps']:.0f}, {r['untraced_after']['rps']:.0f}",
         "", None),
        ("2", "req/s traced (OTLP export on)", f"{r['traced']['rps']:.0f}", "", None),
        ("2", "throughput loss", f"{r['loss_pct']:.1f}%", "<= 2% (on a GPU)", r["loss_pct"] <= 2),
        ("2", "  collector CPU during traced load (cores)", f"{r['collector_cores']:.2f}", "", None),
        ("3", "server spans received / requests served",
         f"{r['server_spans']} / {r['traced']['ok']}", "all", r["server_spans"] >= r["traced"]["ok"]),
        ("3", "  server spans received before stop, per collector CPU-second (load + drain)",
         f"{r['settled_spans']} / {r['settled_cpu_s']:.1f} s = {r['settled_spans'] / max(r['settled_cpu_s'], 1e-9):.0f}"
         if "settled_spans" in r else "?", "", None),
        ("3", "spans exported per request (expect 1 + 102)", f"{r['spans_per_request']:.1f}", "", None),
        ("3", "OTLP bytes exported per request; per span", f"{r['bytes_per_request']:.0f}; "
         f"{r['bytes_per_span']:.0f}", "", None),
        ("3", "  collector: requests finished; spans built / exported / dropped (export queue full)",
         f"{c.get('requests', 0)}; {c.get('spans', 0)} / {d.get('spans_exported', '?')} / "
         f"{d.get('spans_dropped_queue_full', '?')}", "", None),
        ("3", "  collector: events lost (ring buffer full)", known(lost), "0", lost == 0),
    ]
