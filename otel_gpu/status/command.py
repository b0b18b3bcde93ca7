"""`otel-gpu status`: what the running collector is doing, from the state file it
rewrites every few seconds (file.py). Any user can run it: no root, no BPF.

Exit status: 0 a collector is running and its state is fresh; 1 none is running (the
last one's final state is shown when it left one), or the state is stale (its pid is
gone, or it was not rewritten for STALE_INTERVALS intervals: stuck); 2 bad arguments."""
from __future__ import annotations

import json
import os
import sys
import textwrap
import time
from typing import Optional

from .. import proc, sanitize
from ..probes.prologue import SINGLE_STEP_COST
from ..ratelimit import split_drops
from .file import STALE_INTERVALS, default_status_path, read_state


def add_parser(subparsers) -> None:
    p = subparsers.add_parser("status", help="what the running collector is doing (no root needed)")
    p.add_argument("--file", metavar="PATH", default=None,
                   help="state file (default: $OTEL_GPU_STATUS_FILE or /run/otel-gpu/status.json)")
    p.add_argument("--json", action="store_true", help="one JSON object: running, stale, path, state")


def staleness(state: dict, now: float, proc_root: str = "/proc") -> Optional[str]:
    """Why this state is not a running collector's, or None when it is."""
    pid = state["pid"]
    if state.get("stopped_at"):
        return f"collector pid {pid} stopped at {time.strftime('%Y-%m-%d %H:%M:%S', time.localtime(state['stopped_at']))}"
    if not os.path.exists(proc.path(proc_root, pid)):
        return f"collector pid {pid} is gone"
    ticks = proc.start_time(proc_root, pid)
    if state.get("pid_start_ticks") and ticks is not None and ticks != state["pid_start_ticks"]:
        return f"collector pid {pid} is gone (the pid is now another process)"
    age = now - float(state["written_at"])
    interval = float(state.get("interval_s") or 2.0)
    if age > STALE_INTERVALS * interval:
        return f"not rewritten for {age:.0f} s (every {interval:g} s expected): the collector is stuck"
    return None


def _duration(s: float) -> str:
    s = int(s)
    d, s = divmod(s, 86400)
    h, s = divmod(s, 3600)
    m, s = divmod(s, 60)
    return "".join(f"{v}{u}" for v, u in ((d, "d"), (h, "h"), (m, "m")) if v) + f"{s}s"


def _pairs(counts: dict) -> str:
    return ", ".join(f"{k} {v}" for k, v in sorted(counts.items())) or "none"


def _export_line(e: dict, now: float) -> str:
    state = e["state"]
    if state == "failing" and e.get("failing_since"):
        when = time.strftime("%H:%M:%S", time.localtime(e["failing_since"]))
        state = f"FAILING since {when} ({_duration(now - e['failing_since'])})"
    counts = [f"{k.replace('_', ' ')} {v}" for k, v in e.items() if k not in ("name", "state", "failing_since")]
    return f"  {e['name']:<8} {state}: {', '.join(counts)}"


def to_text(state: dict, now: float, stale: Optional[str]) -> str:
    lines = []
    if stale:
        lines.append(f"{'STOPPED' if state.get('stopped_at') else 'STALE'}: {stale}. The last state it wrote:")
    lines.append(f"otel-gpu {state.get('version', '?')}, pid {state['pid']}, up {_duration(state.get('uptime_s', 0))}"
                 f" (state written {max(0.0, now - state['written_at']):.1f} s ago)")
    procs = state.get("processes", {})
    lines.append(f"processes traced: {procs.get('count', 0)}")
    lines += [f"  {p['pid']:>7}  {sanitize.text(str(p['name'])):<16} {p['role']}" for p in procs.get("listed", [])]
    if procs.get("count", 0) > len(procs.get("listed", [])):
        lines.append(f"  ... and {procs['count'] - len(procs['listed'])} more")
    probes = state.get("probes", {})
    lines.append(f"probes: {probes.get('tracepoints', 0)} tracepoints; uprobes on {probes.get('files', 0)} files")
    lines += textwrap.wrap(f"attached, by function: {_pairs(probes.get('attached', {}))}", 100,
                           initial_indent="  ", subsequent_indent="    ")
    lines += textwrap.wrap(f"FAILED to attach: {_pairs(probes['failed'])}" if probes.get("failed") else
                           "failed to attach: none", 100, initial_indent="  ", subsequent_indent="    ")
    if probes.get("single_stepped"):  # each call of these pays two exceptions (probes/prologue.py)
        lines += textwrap.wrap(f"single-stepped by x86 ({SINGLE_STEP_COST}): {', '.join(probes['single_stepped'])}",
                               100, initial_indent="  ", subsequent_indent="    ")
    routes = probes.get("launch_routes")
    if routes and (routes["at_driver"] or routes["at_runtime"]):  # probes/launch_routes.py
        lines.append(f"  runtime launches of {routes['at_driver']} processes counted at the driver alone (one probe "
                     f"a launch), of {routes['at_runtime']} at the runtime's probe")
    maps = state.get("kernel_maps")
    if maps:  # kernel_io/map_memory.py
        lines.append(f"kernel memory (BPF maps): {maps['mb']:g} MB on {maps['cpus']} CPUs; at {maps['node_cpus']} CPUs "
                     f"{maps['node_mb']:g} MB, {maps['node_full_mb']:g} MB with every table made by need full")
    req = state.get("requests", {})
    lines.append(f"requests: {req.get('finished', 0)} finished, {req.get('per_second', 0):g}/s over the last interval;"
                 f" spans: {state.get('spans', 0)}")
    lines.append(f"CUDA calls by attribution: {_pairs(state.get('attribution', {}))}")
    lines += textwrap.wrap(f"by rule (pipeline/rules.py): {_pairs(state.get('attribution_rules', {}))}", 100,
                           initial_indent="  ", subsequent_indent="    ")
    drops = {k: v for k, v in split_drops(state.get("counters", {}))[0].items() if v}
    lines.append(f"drops and errors (counters): {_pairs(drops)}")
    lines.append("export:")
    lines += [_export_line(e, now) for e in state.get("exports", [])] or ["  nowhere"]
    return "\n".join(lines)


def run(args, out=None, now: Optional[float] = None) -> int:
    out = out or sys.stdout
    path = args.file or default_status_path()
    now = time.time() if now is None else now
    try:
        state = read_state(path)
    except FileNotFoundError:
        return _not_running(args, out, path, f"no collector is running: no state file at {path} "
                            "(`otel-gpu run` writes it every 2 s; --file or OTEL_GPU_STATUS_FILE for another path)")
    except (OSError, ValueError) as e:
        return _not_running(args, out, path, f"cannot read the state file {path}: {e}")
    stale = staleness(state, now)
    if args.json:
        out.write(json.dumps({"running": stale is None, "stale": stale, "path": path, "state": state},
                             sort_keys=True) + "\n")
    else:
        out.write(to_text(state, now, stale) + "\n")
    return 0 if stale is None else 1


def _not_running(args, out, path: str, message: str) -> int:
    if args.json:
        out.write(json.dumps({"running": False, "stale": None, "path": path, "state": None,
                              "error": message}) + "\n")
    else:
        print(f"otel-gpu status: {message}", file=sys.stderr)
    return 1
