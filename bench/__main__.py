"""`python -m bench [--quick] [--items 1,2,3,5,6,7]`: every otel-gpu overhead figure,
measured side by side in one run; prints a table and writes
bench/results/<date>-<host>.json. Needs root (eBPF), bpftrace, gcc, py-spy."""
from __future__ import annotations

import argparse
import datetime
import os
import statistics
import sys
import time
from pathlib import Path

from . import machine
from .items import (big_request, context_switches, device_clock_records, first_requests, go_goroutines, h2_streams,
                    http_service_load, idle_node, launch_breakdown, launch_overhead, many_processes, nccl_calls, neighbour_flood,
                    probe_links, probe_prologue, python_contexts, runtime_driver_dedup, runtime_driver_request,
                    start_and_footprint,
                    sustained_launches, tls_requests, unselected_process, untraced_syscalls)
from .collector import Collector
from .native import use_private_cudart
from .report import profile_text, table, write_json

RESULTS = Path(__file__).resolve().parent / "results"
READY_TARGET_S = 1.5  # issue 13


def main() -> int:
    ap = argparse.ArgumentParser(prog="python -m bench", description=__doc__)
    ap.add_argument("--quick", action="store_true", help="short phases (10 s sustained) for development")
    ap.add_argument("--items", default="1,1b,1c,2,3,5,6,7,8,9,10,11,12,13,14,15,16,17,18,19,20,21",
                    help="comma-separated items to run (4 comes with any)")
    ap.add_argument("--wait-quiet", type=float, default=120,
                    help="seconds to wait for other collectors/bpftrace to finish before each item")
    args = ap.parse_args()
    if os.geteuid() != 0:
        print("bench: needs root (eBPF)", file=sys.stderr)
        return 2
    items = set(args.items.split(",")) | {"4"}  # start figures come with any
    host = machine.describe()
    host["libcudart"] = use_private_cudart()
    stamp = datetime.datetime.now().strftime("%Y-%m-%d-%H%M")
    # Collector settings from the environment (OTEL_GPU_STREAM_BUDGET, ...): the collectors
    # the items start inherit them, so a run's figures say what they were measured with.
    settings = {k: v for k, v in os.environ.items() if k.startswith("OTEL_GPU_")}
    data = {"machine": host, "quick": args.quick, "started": stamp, "collector_env": settings,
            "foreign_tracers": {}, "loadavg": {}, "item_s": {}}
    out = RESULTS / f"{stamp}-{host['host']}{'-quick' if args.quick else ''}.json"  # a run never writes over another
    starts: list[float] = []
    rows: list = []
    steps = [("1", "launch", lambda: launch_overhead.run(args.quick, starts), launch_overhead.rows),
             ("1b", "ablation", lambda: launch_breakdown.run(args.quick), launch_breakdown.rows),
             ("1c", "neighbour", lambda: unselected_process.run(args.quick, starts), unselected_process.rows),
             ("13", "probes", lambda: probe_links.run(args.quick, starts), probe_links.rows),
             ("15", "prologue", lambda: probe_prologue.run(args.quick), probe_prologue.rows),
             ("3", "sustained", lambda: sustained_launches.run(args.quick, starts, RESULTS, stamp), sustained_launches.rows),
             ("2", "http", lambda: http_service_load.run(args.quick, starts, RESULTS, stamp), http_service_load.rows),
             ("12", "rates", lambda: many_processes.run(args.quick, starts), many_processes.rows),
             ("5", "big_request", lambda: big_request.run(args.quick, starts), big_request.rows),
             ("6", "python_context", lambda: python_contexts.run(args.quick, starts), python_contexts.rows),
             ("14", "go", lambda: go_goroutines.run(args.quick, starts), go_goroutines.rows),
             ("7", "untraced", lambda: untraced_syscalls.run(args.quick, starts), untraced_syscalls.rows),
             ("17", "switches", lambda: context_switches.run(args.quick, starts), context_switches.rows),
             ("10", "nccl", lambda: nccl_calls.run(args.quick, starts), nccl_calls.rows),
             ("11", "dedup", lambda: runtime_driver_dedup.run(args.quick, starts), runtime_driver_dedup.rows),
             ("21", "runtime_driver_request", lambda: runtime_driver_request.run(args.quick, starts),
              runtime_driver_request.rows),
             ("8", "first_requests", lambda: first_requests.run(args.quick, starts), first_requests.rows),
             ("9", "tls", lambda: tls_requests.run(args.quick, starts), tls_requests.rows),
             ("16", "h2_streams", lambda: h2_streams.run(args.quick, starts), h2_streams.rows),
             ("18", "flood", lambda: neighbour_flood.run(args.quick, starts), neighbour_flood.rows),
             ("19", "idle", lambda: idle_node.run(args.quick, starts), idle_node.rows),
             ("20", "device_clock", lambda: device_clock_records.run(args.quick, starts), device_clock_records.rows),
             ("4", "start", lambda: start_and_footprint.run(args.quick, starts), lambda r: start_and_footprint.rows(r, READY_TARGET_S))]
    for key, name, run, to_rows in steps:
        if key not in items:
            continue
        print(f"bench: item {key} ({name}) ...", file=sys.stderr, flush=True)
        data["foreign_tracers"][name] = machine.wait_quiet(args.wait_quiet)
        data["loadavg"][name] = machine.loadavg()
        t0 = time.monotonic()
        data[name] = run()
        data["item_s"][name] = round(time.monotonic() - t0, 1)
        print(f"bench: item {key} ({name}) took {data['item_s'][name]:.0f} s", file=sys.stderr, flush=True)
        data["foreign_tracers"][name] += [f"(at end) {t}" for t in machine.foreign_tracers()]
        rows += to_rows(data[name])
        write_json(out, data)  # partial results survive a later failure
    if starts:
        data["ready_s"] = starts
        rows.append(("4", f"start to 'ready' (s), every start this run (cold and warm BPF cache): median of "
                          f"{len(starts)} starts, max",
                     f"{statistics.median(starts):.2f}, {max(starts):.2f}", "", None))  # target: item_start's warm row
        loads = Collector.loads
        if loads:
            data["load_s"] = loads
            rows.append(("4", "  of which the BPF load (compile or cache, verifier, tracepoints; s): median, max",
                         f"{statistics.median(loads):.2f}, {max(loads):.2f}", "", None))
    rows.sort(key=lambda r: r[0][0])  # stable: 1 and 1b stay in run order
    text = table(host, rows)
    for name in ("sustained", "http"):
        prof = (data.get(name) or {}).get("profile") or ((data.get(name) or {}).get("streamed") or {}).get("profile")
        if name in data:
            text += "\n\n" + profile_text(f"collector profile during {name}", prof)
    busy = {k: v for k, v in data["foreign_tracers"].items() if v}
    if busy:
        text += f"\n\nWARNING: other tracers were running (their probes add to ours): {busy}"
    text += f"\nload average at each item's start: {data['loadavg']}"
    print(text)
    data["table"] = text
    write_json(out, data)
    print(f"\nwrote {out}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
