"""Item 4: start to `ready`, cold (the BPF program compiled with clang, then written
to the BPF cache) and warm (the same program from the cache: no compile), side by
side in one run, with the collector's RSS once idle after each, and the kernel memory
of its BPF maps (its status file: otel_gpu/kernel_io/map_memory.py), here and projected
to a 224-CPU node. Each cold start gets an empty cache directory of its own; the warm
start after it reads what it wrote."""
from __future__ import annotations

import shutil
import statistics
import tempfile
import time

from otel_gpu.status.file import read_state

from ..collector import Collector

IDLE_S = 2.0  # after `ready`: the RSS a quiet collector keeps
MAPS_TARGET_MB = 64  # issue 45: kernel memory at 224 CPUs


def _start(cache: str) -> dict:
    col = Collector(args=("--bpf-cache", cache))
    try:
        time.sleep(IDLE_S)
        try:
            maps = read_state(col.status_file).get("kernel_maps") or None
        except (OSError, ValueError):
            maps = None
        return {"ready_s": col.ready_s, "load_s": col.load_s, "rss_mb": col.rss_mb(), "kernel_maps": maps,
                "from_cache": any("BPF program from the cache" in l for l in col.log.lines)}
    finally:
        col.stop()


def run(quick: bool, starts: list) -> dict:
    out: dict = {"cold": [], "warm": []}
    for _ in range(1 if quick else 3):
        cache = tempfile.mkdtemp(prefix="otel-gpu-bench-cache-")
        try:
            out["cold"].append(_start(cache))
            out["warm"].append(_start(cache))
        finally:
            shutil.rmtree(cache, ignore_errors=True)
    starts += [s["ready_s"] for s in out["cold"] + out["warm"]]
    return out


def rows(r: dict, target_s: float) -> list:
    def fig(kind, key, fmt="{:.2f}"):
        xs = [s[key] for s in r[kind] if s[key] is not None]
        return f"{fmt.format(statistics.median(xs))}, {fmt.format(max(xs))}" if xs else "n/a"

    warm_ok = bool(r["warm"]) and all(s["from_cache"] for s in r["warm"]) and not any(
        s["from_cache"] for s in r["cold"])
    worst_warm = max((s["ready_s"] for s in r["warm"]), default=None)
    n = len(r["cold"])
    return [
        ("4", f"start to 'ready' (s), cold: the BPF program compiled (clang) and cached: median, max of {n}",
         fig("cold", "ready_s"), "", None),
        ("4", "  of which the BPF load (compile + verifier + tracepoints, s)", fig("cold", "load_s"), "", None),
        ("4", f"start to 'ready' (s), warm: the same program from the BPF cache: median, max of {n}",
         fig("warm", "ready_s"), f"<= {target_s}", warm_ok and worst_warm is not None and worst_warm <= target_s),
        ("4", "  of which the BPF load (maps + verifier + tracepoints, s)", fig("warm", "load_s"), "", None),
        ("4", f"collector RSS {IDLE_S:.0f} s after 'ready' (MB), cold / warm: medians",
         f"{statistics.median(s['rss_mb'] for s in r['cold']):.0f} / "
         f"{statistics.median(s['rss_mb'] for s in r['warm']):.0f}", "", None),
    ] + _map_rows(r)


def _map_rows(r: dict) -> list:
    """The kernel memory of the BPF maps, from the last start (the same program each time)."""
    maps = next((s["kernel_maps"] for s in reversed(r["cold"] + r["warm"]) if s.get("kernel_maps")), None)
    if maps is None:
        return [("4", "kernel memory of the BPF maps at 224 CPUs (MB)", "n/a: no status", f"<= {MAPS_TARGET_MB}",
                 False)]
    return [
        ("4", f"kernel memory of the BPF maps (MB): here ({maps['cpus']} CPUs) / projected at "
              f"{maps['node_cpus']} CPUs", f"{maps['mb']:g} / {maps['node_mb']:g}", f"<= {MAPS_TARGET_MB} at "
              f"{maps['node_cpus']}", maps["node_mb"] <= MAPS_TARGET_MB),
        ("4", f"  the same with every table made by need full, at {maps['node_cpus']} CPUs (MB); largest maps",
         f"{maps['node_full_mb']:g}; " + ", ".join(f"{k} {v:g}" for k, v in sorted(maps["largest"].items(), key=lambda kv: -kv[1])), "", None),
    ]
