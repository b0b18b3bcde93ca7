"""Items 3 and 4: launches at a sustained rate from several threads of the C loop,
inside one open HTTP request (every launch is a ring-buffer event) and outside any
request (counted in a BPF map only). Measures events lost, the collector's CPU
(cores = utime+stime / wall) and its RSS after the load; py-spy profiles the
collector during the streamed run."""
from __future__ import annotations

import time
from pathlib import Path

from ..collector import Collector, known
from ..native import LaunchLoop
from ..profile import Profile

RATE, THREADS = 200_000, 4


def _one(col: Collector, seconds: int, http: bool, profile_to: Path | None) -> dict:
    loop = LaunchLoop("--threads", str(THREADS), "--rate", str(RATE), "--seconds", str(seconds), http=http)
    col.wait_traced(loop.pid)
    cpu0, t0 = col.cpu_seconds(), time.monotonic()
    prof = Profile(col.pid, max(seconds - 2, 1), profile_to) if profile_to else None
    loop.go()
    res = loop.result(timeout=seconds + 120)
    time.sleep(1.0)  # let the collector drain what is queued
    wall = time.monotonic() - t0
    res["collector_cores"] = (col.cpu_seconds() - cpu0) / wall
    res["rate"] = res["launched"] / res["seconds"]
    res["rss_mb"] = col.rss_mb()
    if prof:
        res["profile"] = prof.result()
    return res


def run(quick: bool, starts: list, results_dir: Path, stamp: str) -> dict:
    seconds = 3 if quick else 30
    out = {"seconds": seconds, "rate_target": RATE, "threads": THREADS}
    col = Collector()
    starts.append(col.ready_s)
    try:
        time.sleep(2.0)  # idle: the first scans are done
        out["rss_mb_idle"] = col.rss_mb()
        out["streamed"] = _one(col, seconds, True, results_dir / f"{stamp}-profile-sustained.txt")
        out["rss_mb_after_load"] = col.rss_mb()
    finally:
        out["collector_streamed"] = col.stop()
    s, c = out["streamed"], out["collector_streamed"]
    s["counted"] = c.get("thread", 0) + c.get("process", 0) + c.get("ambiguous", 0)
    s["lost"] = s["launched"] - s["counted"]
    s["lost_events_bpf"] = Collector.lost_events(c)
    col = Collector()
    starts.append(col.ready_s)
    try:
        out["rollup"] = _one(col, max(seconds // 2, 5), False, None)
    finally:
        out["collector_rollup"] = col.stop()
    out["rollup"]["counted"] = out["collector_rollup"].get("outside", 0)
    return out


def rows(r: dict) -> list:
    s, u = r["streamed"], r["rollup"]
    return [
        ("3", f"streamed (in request): launches/s achieved, {r['threads']} threads, {r['seconds']} s",
         f"{s['rate']:.0f}", f"~{r['rate_target']}", None),
        ("3", "  events lost (launched - counted) / launched",
         f"{s['lost']} / {s['launched']} ({100 * s['lost'] / max(s['launched'], 1):.1f}%)", "0", s["lost"] <= 0),
        ("3", "  BPF ringbuf_full count (lost_events)", known(s["lost_events_bpf"]), "0", s["lost_events_bpf"] == 0),
        ("3", "  collector CPU (cores)", f"{s['collector_cores']:.2f}", "", None),
        ("3", "rollup (no request): launches/s; collector CPU (cores)",
         f"{u['rate']:.0f}; {u['collector_cores']:.3f}", "", None),
        ("3", "  rollup: counted / launched (incl. 10k warm-up)", f"{u['counted']} / {u['launched']}", "all",
         u["counted"] >= u["launched"]),
        ("4", "collector VmRSS idle / after the sustained load (MB; 205 before issue 13's footprint work)",
         f"{r.get('rss_mb_idle', 0):.0f} / {r['rss_mb_after_load']:.0f}", "<= 120",
         max(r.get("rss_mb_idle", 0), r["rss_mb_after_load"]) <= 120),
    ]
