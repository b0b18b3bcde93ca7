"""Item 18: a neighbour's flood does not blind the GPU service (issue 45, item 4).

The GPU service (bench/http_service.py, real libcudart) and a plain TCP listener that
holds every connection it accepts (tests/bpf/targets/idle_listener.py: a front proxy,
or a flood; LISTENERS processes on one port) share one cgroup, so the collector traces
the listener as a related server. IDLE idle connections go to the service and OLD
keep-alive ones ask one request each; then FLOOD connections go to the listener, held
by client processes (bench/connection_holder.py) from loopback source addresses of
their own (one address has ~28,000 ephemeral ports). After the flood the OLD
connections ask again and NEW ones ask once. Every request asks for its own number of
launches (/launch/N, N unique), so a span is exact when its path, its gpu.launches and
its launch children (one by one, or counted in a rollup child while the collector is
behind) all say N. Then the collector is stopped: its stop must fit
--shutdown-timeout + 1 s. Collector CPU and RSS over the flood, and the counters that
say where the neighbour's connections went, are printed beside."""
from __future__ import annotations

import http.client
import subprocess
import sys
import time
from pathlib import Path

from otel_gpu.config import Config
from otel_gpu.demo.runner import LineWatcher, stop_process
from tests.support.counting_receiver import CountingReceiver

from ..collector import Collector
from ..target import Service

LISTENER = Path(__file__).resolve().parents[2] / "tests" / "bpf" / "targets" / "idle_listener.py"
OLD, NEW = 20, 20
LISTENERS = 5        # processes sharing the listener's port (SO_REUSEPORT): one holds <= 20,000 descriptors here
PER_HOLDER = 18_000  # connections a client process holds, from a source address of its own (28,232 ports each)
SPAN_WAIT_S = 30


class Procs:
    """Child processes that print a line when ready, stopped together."""

    def __init__(self) -> None:
        self.procs: list = []

    def start(self, argv: list, ready: str, timeout: float = 120) -> str:
        proc = subprocess.Popen(argv, stdin=subprocess.PIPE, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                text=True)
        self.procs.append(proc)
        log = LineWatcher(proc.stdout, echo=None)
        if not log.wait_for(ready, timeout):
            raise RuntimeError(f"{argv[-3:]} not ready:\n" + "".join(log.lines))
        return next(l for l in log.lines if ready in l)

    def stop(self) -> None:
        for proc in self.procs:
            stop_process(proc, timeout=30)


def _hold(procs: Procs, port: int, n: int, first_source: int) -> None:
    """n idle connections to port, PER_HOLDER a process from 127.0.0.<first_source>, .. on."""
    for i, start in enumerate(range(0, n, PER_HOLDER)):
        count = min(PER_HOLDER, n - start)
        procs.start([sys.executable, "-m", "bench.connection_holder", str(port), f"127.0.0.{first_source + i}",
                     str(count)], f"held {count}")


def _ask(conns: list, first: int) -> list:
    """One request per connection, connection i asking for first + i launches: the N asked."""
    asked = []
    for i, c in enumerate(conns):
        c.request("GET", f"/launch/{first + i}")
        assert c.getresponse().read() == b"ok"
        asked.append(first + i)
    return asked


def _exact(rx: CountingReceiver, pid: int, asked: list) -> int:
    """How many of the requests asked have exactly one server span, exact."""
    with rx.lock:
        mine = [(sid, a) for sid, a in rx.servers.items() if a.get("process.pid") == pid]
    by_path: dict = {}
    for sid, a in mine:
        by_path.setdefault(a.get("url.path"), []).append((sid, a))
    exact = 0
    for n in asked:
        spans = by_path.get(f"/launch/{n}", [])
        if len(spans) != 1:
            continue
        sid, a = spans[0]
        singles = rx.children_of(sid)[0]  # one by one, or counted (a rollup child, while the collector is behind)
        if a.get("gpu.launches") == n and singles + a.get("otel_gpu.spans.rolled_up", 0) == n:
            exact += 1
    return exact


def _wait_exact(rx: CountingReceiver, pid: int, asked: list) -> int:
    deadline = time.monotonic() + SPAN_WAIT_S
    while (exact := _exact(rx, pid, asked)) < len(asked) and time.monotonic() < deadline:
        time.sleep(0.25)
    return exact


def run(quick: bool, starts: list) -> dict:
    idle, flood = (1_000, 15_000) if quick else (5_000, 72_000)
    rx = CountingReceiver().start()
    svc = Service()
    procs = Procs()
    out: dict = {"idle": idle, "flood": flood, "old": OLD, "new": NEW,
                 "shutdown_timeout_s": Config().shutdown_timeout_s,
                 "same_cgroup": svc.cgroup.path is not None}  # else the listeners are not related servers
    try:
        line = procs.start(svc.cgroup.wrap([sys.executable, str(LISTENER), "0", "--reuseport"]), "listening on")
        port = int(line.split()[2])
        for _ in range(LISTENERS - 1):
            procs.start(svc.cgroup.wrap([sys.executable, str(LISTENER), str(port), "--reuseport"]), "listening on")
        col = Collector(otlp_endpoint=rx.endpoint)
        starts.append(col.ready_s)
        try:
            col.wait_traced(svc.pid)
            for proc in procs.procs:
                col.wait_traced(proc.pid)
            _hold(procs, svc.port, idle, 2)
            old = [http.client.HTTPConnection("127.0.0.1", svc.port, timeout=60) for _ in range(OLD)]
            asked = _ask(old, 1)
            cpu0, t0 = col.cpu_seconds(), time.monotonic()
            _hold(procs, port, flood, 3)
            out["flood_s"] = round(time.monotonic() - t0, 1)
            time.sleep(2)  # the collector takes in what the flood made
            out["collector_cores_over_flood"] = round((col.cpu_seconds() - cpu0) / (time.monotonic() - t0), 3)
            out["collector_rss_mb"] = round(col.rss_mb(), 1)
            asked += _ask(old, 1 + OLD)
            new = [http.client.HTTPConnection("127.0.0.1", svc.port, timeout=60) for _ in range(NEW)]
            asked += _ask(new, 1 + 2 * OLD)
            out["exact_before"] = _wait_exact(rx, svc.pid, asked[:OLD])
            out["exact_old_after"] = _wait_exact(rx, svc.pid, asked[OLD:2 * OLD])
            out["exact_new_after"] = _wait_exact(rx, svc.pid, asked[2 * OLD:])
        finally:
            summary = col.stop()
        out["stop_s"] = round(col.stop_s, 2)
        counted = {**summary.get("dropped", {}), **summary.get("counted", {})}
        out["counters"] = {k: v for k, v in counted.items() if k.startswith("conn") or "share" in k or k == "lost_events"}
    finally:
        procs.stop()
        svc.stop()
        rx.stop()
    return out


def rows(r: dict) -> list:
    bound = r["shutdown_timeout_s"] + 1
    who = "a related listener" if r["same_cgroup"] else "an unrelated listener (no cgroup of its own here)"
    what = (f"{who}'s flood ({r['idle']} idle connections to the GPU service, then {r['flood']} to "
            f"the listener in {r.get('flood_s', '?')} s)")
    out = [("18", f"{what}: exact spans of the service's {r['old']} keep-alive connections before / after, "
                  f"and of {r['new']} new ones after",
            f"{r.get('exact_before')}/{r['old']}, {r.get('exact_old_after')}/{r['old']}, "
            f"{r.get('exact_new_after')}/{r['new']}", "all",
            (r.get("exact_before"), r.get("exact_old_after"), r.get("exact_new_after")) == (r["old"], r["old"], r["new"])),
           ("18", "  the collector's stop after the flood (SIGINT to exit)", f"{r['stop_s']:.1f} s",
            f"<= {bound} s (--shutdown-timeout + 1)", r["stop_s"] <= bound)]
    if "collector_cores_over_flood" in r:
        out.append(("18", f"  collector over the flood: cores, RSS; counters {r.get('counters')}",
                    f"{r['collector_cores_over_flood']} cores, {r['collector_rss_mb']} MB", "", None))
    return out
