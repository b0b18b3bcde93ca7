"""`python -m bench.items.gpu_launch_cost [--rounds R] [--json FILE]`: on a GPU host, what
the collector adds to a CUDA launch made inside a request, and why. One PyTorch server
(tests/gpu/torch_server.py) timed with no collector, traced, and traced without the
Python context probes, the three phases interleaved over R rounds (sequential phases drift
on a GPU host). Each phase: GET /launches/N (N one-launch additions: bound by the host's
launch path) and GET /decode/S (eager forwards, each synchronised). Then, where the
device-clock library builds (gcc, CUPTI headers), a second server loading it
(CUDA_INJECTION64_PATH) timed with no collector (the library idle) and traced (the library
on): device-clock mode's cost per launch (issue 46: target at most 1 us). Then, traced with
the kernel's BPF stats on, one more GET /launches/N: the launch programs' runs a launch
(issue 44: 1.00, one trap a launch; 2.00 where the runtime's launch reaches the driver and
both probes fire), and the kernel memory of the collector's BPF maps on this host (#45 item
1). The report gives each traced phase's spread over the rounds. Each traced phase is timed
once the collector counts the service's runtime launches at the driver alone
(probes/launch_routes.py), as a long-lived service's are after its first seconds; the
report says in how many phases it got there. Also printed, where gcc is present: item 15's
trap costs on this host (the first bytes of the probed functions are in
scripts/gpu-tier.sh's machine log).
Needs root, a GPU, PyTorch, bcc (scripts/gpu-tier.sh --bench runs it on a bare GPU machine)."""
from __future__ import annotations

import json
import shutil
import statistics
import sys
import tempfile
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

from tests.support.otlp_receiver import OtlpReceiver

from otel_gpu.status.file import read_state

from .. import bpfstats
from ..collector import Collector
from ..target import Service
from . import probe_prologue, standalone

ROOT = Path(__file__).resolve().parents[2]
SERVER = ROOT / "tests" / "gpu" / "torch_server.py"
LAUNCHES, DECODE_STEPS, REPS = 20_000, 200, 3
EMULATED_TRAP = "after endbr64 (push)"  # probe_prologue's phase: a probe on an emulated push
DEVICE_CLOCK_ROUNDS = 3  # its own server and phases: at most this many of the --rounds (time)
PHASES = (("untraced", None), ("traced", ()), ("no contexts", ("--no-python-context",)))
AT_DRIVER_WAIT_S = 10.0
AT_DRIVER: list = []  # per traced phase: whether its timed requests ran with the driver's probe alone
# (not where the runtime's launches never reach the driver's probed entries: both probes stay)


def _seconds(svc: Service, path: str) -> float:
    with urllib.request.urlopen(f"http://127.0.0.1:{svc.port}{path}", timeout=120) as r:
        return json.loads(r.read())["seconds"]


@contextmanager
def _phase(svc: Service, rx, args, settle_s: float = 0.0):
    """A phase of the interleaving: with no collector (args None), or with one started with
    `args` and tracing `svc` (then settle_s more); the first request after a start is not timed."""
    col = None if args is None else Collector(otlp_endpoint=rx.endpoint, args=args)
    try:
        if col is not None:
            col.wait_traced(svc.pid)
            time.sleep(settle_s)
        _seconds(svc, f"/launches/{LAUNCHES // 10}")
        if col is not None:  # probes/launch_routes.py: kernels paired, then stable
            AT_DRIVER.append(col.until_at_driver(svc.pid, AT_DRIVER_WAIT_S,
                                                 lambda: _seconds(svc, f"/launches/{LAUNCHES // 10}")))
        yield col
    finally:
        if col is not None:
            col.stop()
        rx.clear()


def _device_clock(rounds: int, rx, base: float) -> dict | str:
    """Per launch, what a server loading the device-clock library adds, idle and on, over the
    plain server's untraced `base` (seconds for LAUNCHES)."""
    from otel_gpu.device_clock import library
    try:
        lib = library.build(Path(tempfile.mkdtemp(prefix="otel-gpu-cupti-")))
    except RuntimeError as e:
        return f"not measured: the device-clock library does not build here ({str(e).splitlines()[0]})"
    svc = Service(argv=[sys.executable, str(SERVER)], env={"CUDA_INJECTION64_PATH": str(lib)})
    phases = {"library idle": None, "library on, traced": ()}
    times: dict = {name: [] for name in phases}
    try:
        _seconds(svc, f"/launches/{LAUNCHES}")
        for _ in range(rounds):
            for name, args in phases.items():
                with _phase(svc, rx, args, settle_s=1.5):  # the library sees the collector's flag within 1 s
                    times[name] += [_seconds(svc, f"/launches/{LAUNCHES}") for _ in range(REPS)]
    finally:
        svc.stop()
    return {name: (statistics.median(t) - base) / LAUNCHES * 1e6 for name, t in times.items()}


def _program_runs(svc: Service, rx) -> dict:
    """One traced GET /launches/N with bpf_stats on: runs and ns a launch of the launch
    programs (runtime and driver; their names cut at 15 characters by the kernel), and the
    kernel memory of the collector's BPF maps on this host (#45 item 1: measured on a GPU
    host, and projected to 224 CPUs as bench item 4 does)."""
    with _phase(svc, rx, ()) as col, bpfstats.enabled():
        before = bpfstats.snapshot(col.pid)
        _seconds(svc, f"/launches/{LAUNCHES}")
        ran = bpfstats.delta(before, bpfstats.snapshot(col.pid))
        try:
            maps = read_state(col.status_file).get("kernel_maps")
        except (OSError, ValueError):
            maps = None
    return {**bpfstats.launch_runs(ran, LAUNCHES), "kernel_maps": maps}


def measure(rounds: int) -> dict:
    svc, rx = Service(argv=[sys.executable, str(SERVER)]), OtlpReceiver().start()
    times: dict = {name: {"launches": [], "decode": []} for name, _ in PHASES}
    out: dict = {"launches": LAUNCHES, "decode_steps": DECODE_STEPS, "reps": REPS, "rounds": rounds}
    try:
        for path in (f"/launches/{LAUNCHES}", f"/decode/{DECODE_STEPS}"):  # warm-up: lazy loads
            _seconds(svc, path)
        for _ in range(rounds):
            for name, args in PHASES:
                with _phase(svc, rx, args):
                    times[name]["launches"] += [_seconds(svc, f"/launches/{LAUNCHES}") for _ in range(REPS)]
                    times[name]["decode"] += [_seconds(svc, f"/decode/{DECODE_STEPS}") for _ in range(REPS)]
        out["program_runs"] = _program_runs(svc, rx)
        out["phases_at_driver"] = [sum(AT_DRIVER), len(AT_DRIVER)]
    finally:
        svc.stop()
        rx.stop()
    out["seconds"] = times
    base = {k: statistics.median(v) for k, v in times["untraced"].items()}
    out["added_us_per_launch"] = {
        name: {"launches": (statistics.median(t["launches"]) - base["launches"]) / LAUNCHES * 1e6,
               "decode_pct": 100 * (statistics.median(t["decode"]) / base["decode"] - 1)}
        for name, t in times.items() if name != "untraced"}
    # The spread: each round's median against the untraced rounds' median (#44 item 5).
    out["added_spread_us_per_launch"] = {
        name: [(statistics.median(t["launches"][i:i + REPS]) - base["launches"]) / LAUNCHES * 1e6
               for i in range(0, len(t["launches"]), REPS)]
        for name, t in times.items() if name != "untraced"}
    out["untraced_us_per_launch"] = base["launches"] / LAUNCHES * 1e6
    rx = OtlpReceiver().start()
    try:
        out["device_clock_added_us_per_launch"] = _device_clock(min(rounds, DEVICE_CLOCK_ROUNDS), rx,
                                                                base["launches"])
    finally:
        rx.stop()
    out["trap"] = probe_prologue.run(quick=True) if shutil.which("gcc") else "no gcc on this host"
    return out


def report(r: dict) -> str:
    lines = [f"gpu_launch_cost: {r['launches']} one-launch additions per request, untraced "
             f"{r['untraced_us_per_launch']:.2f} us per launch; median of {r['rounds']}x{r['reps']} interleaved"]
    for name, a in r["added_us_per_launch"].items():
        spread = r.get("added_spread_us_per_launch", {}).get(name) or [a["launches"]]
        lines.append(f"  {name}: +{a['launches']:.2f} us per launch (rounds {min(spread):+.2f}..{max(spread):+.2f}); "
                     f"decode loop ({r['decode_steps']} forwards) {a['decode_pct']:+.1f} %")
    lines.append("  all (ms): " + "; ".join(f"{n} {k} {[round(x * 1e3, 1) for x in v]}"
                                           for n, t in r["seconds"].items() for k, v in t.items()))
    dc = r.get("device_clock_added_us_per_launch")
    if dc is not None:
        lines.append("  device-clock mode (CUDA_INJECTION64_PATH), over the plain server untraced: " + (
            dc if isinstance(dc, str) else "; ".join(f"{n} +{v:.2f} us per launch" for n, v in dc.items())
            + " (target: at most +1 us for the library)"))
    pr = r.get("program_runs")
    if pr:
        lines.append(f"  launch programs (bpf_stats, one traced GET /launches/{r['launches']}): "
                     f"{pr['runs_per_launch']:.2f} runs a launch (target 1.00, #44), {pr['ns_per_launch']:.0f} ns; "
                     + ", ".join(f"{n} {runs}" for n, runs, _ in pr["programs"]))
    maps = (pr or {}).get("kernel_maps")
    if maps:
        lines.append(f"  kernel memory of the BPF maps: {maps['mb']:g} MB here ({maps['cpus']} CPUs), "
                     f"{maps['node_mb']:g} MB projected at {maps['node_cpus']} CPUs (#45 item 1: at most 64)")
    at = r.get("phases_at_driver")
    if at:
        lines.append(f"  traced phases timed with the runtime's launches counted at the driver alone: {at[0]} of {at[1]}")
    trap = r["trap"]
    lines.append("  trap (item 15, an empty program, ns per call): " + (
        trap if isinstance(trap, str) else ", ".join(f"{k} +{v:.0f}" for k, v in trap["added_ns"].items())))
    if not isinstance(trap, str) and "traced" in r["added_us_per_launch"]:
        push = trap["added_ns"][EMULATED_TRAP]  # the probed CUDA entries start with push %rbp
        lines.append(f"  traced launch / the trap ({EMULATED_TRAP}): "
                     f"{r['added_us_per_launch']['traced']['launches'] * 1e3 / push:.2f}x (#44 item 3: at most 1.2x)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(standalone.main("bench.items.gpu_launch_cost", __doc__, "--rounds", int, 3, measure, report))
