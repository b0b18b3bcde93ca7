"""Item 9: what the OpenSSL probes (bpf/tls_probes.c) cost per HTTPS request. The bench
service (stdlib ThreadingHTTPServer, real libcudart) serves GET /launch/0 (no CUDA
call: the HTTP path alone) over HTTPS and over cleartext, one keep-alive connection,
without the collector, then three rounds of with it (default mode) and without it again,
the service alone on one CPU and the load generator and the collector on the others
(bench/cpus.py). What the probes add to the service: its own CPU per request (utime +
stime over the timed load / requests; the traps and programs run on its threads), each
traced phase against the mean of the untraced phases on either side, the median of the
rounds; the verdict compares HTTPS's with HTTP's. Beside it, the added wall time
per request, 1/rps(with) - 1/rps(without), which on a shared machine also pays for the
collector's CPU (shown per request). HTTPS adds the SSL_read_ex/SSL_write_ex uprobes
(entry + return) to what cleartext pays. Then the probes' cost per call alone,
steadier than req/s on a shared machine: bench/tls_loop.py's TLS round trips (one
SSL_write_ex and one SSL_read_ex each, one thread), its CPU time per round trip without,
with and without the collector again (probes/tls_entries.py: where the probes sit)."""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from tests.support.collector_process import cpu_seconds

from .. import cpus
from ..collector import Collector
from ..target import Service

PATH = "/launch/0"


def _certificate(d: Path) -> str:
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=60)
    return f"{cert},{key}"


def _load(svc: Service, seconds: float, col: Collector | None = None, cpus: set[int] | None = None) -> dict:
    """A timed load (its generator on `cpus`), with the service's CPU per request (and the
    collector's, when given)."""
    cpu0, col0 = cpu_seconds(svc.pid), col.cpu_seconds() if col else 0.0
    res = svc.load(seconds, conns=1, path=PATH, cpus=cpus)
    n = max(res["ok"], 1)
    res["service_us"] = (cpu_seconds(svc.pid) - cpu0) / n * 1e6
    if col:
        res["collector_us"] = (col.cpu_seconds() - col0) / n * 1e6
    return res


def _traced(svc: Service, seconds: float, rest: set[int] | None, starts: list) -> tuple[dict, dict]:
    """One traced phase: a collector started (on `rest`), then the timed load."""
    col = Collector()
    starts.append(col.ready_s)
    try:
        if rest is not None:
            cpus.pin(col.pid, rest)
        col.wait_traced(svc.pid)
        svc.load(1, conns=1, path=PATH, cpus=rest)  # warm-up
        phase = _load(svc, seconds, col, cpus=rest)
    finally:
        summary = col.stop()
    return phase, summary


def _phases(svc: Service, seconds: float, rounds: int, starts: list) -> dict:
    """Without the collector, then `rounds` times with it and without it again; the service
    alone on a CPU, the load and the collector on the others (bench/cpus.py), where there are
    two. Each traced phase is held against the untraced ones on either side of it, and the
    figures are the medians of the rounds (one phase of 6 s read -12 to +12 µs here)."""
    own, rest = cpus.split() or (None, None)
    if own is not None:
        cpus.pin(svc.pid, own)
    svc.load(1, conns=1, path=PATH, cpus=rest)  # warm-up
    untraced, traced, finished = [_load(svc, seconds, cpus=rest)], [], 0
    for _ in range(rounds):
        phase, summary = _traced(svc, seconds, rest, starts)
        traced.append(phase)
        finished += summary.get("requests", 0)
        untraced.append(_load(svc, seconds, cpus=rest))
    sides = list(zip(traced, untraced, untraced[1:]))
    service = [t["service_us"] - (a["service_us"] + b["service_us"]) / 2 for t, a, b in sides]
    wall = [(1 / max(t["rps"], 1e-9) - 2 / max(a["rps"] + b["rps"], 1e-9)) * 1e6 for t, a, b in sides]
    return {"service_cpus": sorted(own) if own else None, "rounds": rounds,
            "rps_without": [u["rps"] for u in untraced], "rps_with": [t["rps"] for t in traced],
            "errors": sum(t["errors"] for t in traced), "requests_traced": finished,
            "added_us": statistics.median(wall),
            "service_us_without": [u["service_us"] for u in untraced],
            "service_us_with": [t["service_us"] for t in traced],
            "service_added_rounds": service, "service_added_us": statistics.median(service),
            "collector_us": statistics.median(t["collector_us"] for t in traced)}


def _loop(cert: str, rounds: int) -> float:
    """bench/tls_loop.py's µs of thread CPU per TLS round trip: the median of 3 runs."""
    out = [float(subprocess.run([sys.executable, "-m", "bench.tls_loop", *cert.split(","), str(rounds)],
                                capture_output=True, text=True, check=True, timeout=120).stdout) for _ in range(3)]
    return statistics.median(out)


def _loop_phases(cert: str, rounds: int, starts: list) -> dict:
    before = _loop(cert, rounds)
    col = Collector()
    starts.append(col.ready_s)
    try:
        traced = _loop(cert, rounds)
    finally:
        col.stop()
    after = _loop(cert, rounds)
    return {"us_without": [before, after], "us_with": traced, "added_us": traced - (before + after) / 2}


def run(quick: bool, starts: list) -> dict:
    seconds, rounds = (2, 1) if quick else (3, 3)
    out: dict = {"seconds": seconds, "path": PATH}
    with tempfile.TemporaryDirectory() as d:
        cert = _certificate(Path(d))
        for name, args in (("https", ("--tls", cert)), ("http", ())):
            svc = Service(args)
            try:
                out[name] = _phases(svc, seconds, rounds, starts)
            finally:
                svc.stop()
        out["round_trip"] = _loop_phases(cert, 5_000 if quick else 20_000, starts)
    out["ssl_probes_us"] = out["https"]["service_added_us"] - out["http"]["service_added_us"]
    return out


def rows(r: dict) -> list:
    out = []
    for name in ("https", "http"):
        m = r[name]
        median = statistics.median
        out.append(("9", f"{name.upper()} {r['path']}, 1 connection: req/s without/with the collector, medians of "
                         f"{m['rounds']} rounds",
                    f"{median(m['rps_without']):.0f}/{median(m['rps_with']):.0f}", "", None))
        out.append(("9", f"  {name.upper()}: wall us added per request; the collector's CPU us per request "
                         f"(it finished {m['requests_traced']} requests)",
                    f"{m['added_us']:+.1f}; {m['collector_us']:.1f}", "", None))
        out.append(("9", f"  {name.upper()}: service CPU us per request without/with (medians); added, by round",
                    f"{median(m['service_us_without']):.1f}/{median(m['service_us_with']):.1f}; "
                    f"{', '.join(f'{x:+.1f}' for x in m['service_added_rounds'])}", "", None))
    https, http = r["https"]["service_added_us"], r["http"]["service_added_us"]
    out.append(("9", "service CPU added per request: HTTPS / HTTP (us; the SSL probes' share: the difference)",
                f"{https:+.1f} / {http:+.1f} ({r['ssl_probes_us']:+.1f})", "HTTPS <= 2x HTTP",
                https <= 2 * max(http, 0.0)))
    t = r.get("round_trip")
    if t:
        out.append(("9", "TLS round trip (SSL_write_ex + SSL_read_ex), thread CPU us: without/with/without",
                    f"{t['us_without'][0]:.1f}/{t['us_with']:.1f}/{t['us_without'][1]:.1f}", "", None))
        out.append(("9", "  the SSL probes per round trip (us added; two single-steps would be ~20)",
                    f"{t['added_us']:+.1f}", "", None))
    return out
