"""Item 9: what the OpenSSL probes (bpf/tls_probes.c) cost per HTTPS request. The bench
service (stdlib ThreadingHTTPServer, real libcudart) serves GET /launch/0 (no CUDA
call: the HTTP path alone) over HTTPS and over cleartext, one keep-alive connection,
each without the collector, with it (default mode), and without it again, the service
alone on one CPU and the load generator and the collector on the others (bench/cpus.py).
What the probes add to the service: its own CPU per request (utime + stime over the timed
load / requests; the traps and programs run on its threads), traced against the mean of
the two untraced phases; the verdict compares HTTPS's with HTTP's. Beside it, the added wall time
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


def _phases(svc: Service, seconds: float, starts: list) -> dict:
    """Without, with and without the collector; the service alone on a CPU, the load and the
    collector on the others (bench/cpus.py), where there are two."""
    own, rest = cpus.split() or (None, None)
    if own is not None:
        cpus.pin(svc.pid, own)
    svc.load(1, conns=1, path=PATH, cpus=rest)  # warm-up
    before = _load(svc, seconds, cpus=rest)
    col = Collector()
    starts.append(col.ready_s)
    try:
        if rest is not None:
            cpus.pin(col.pid, rest)
        col.wait_traced(svc.pid)
        svc.load(1, conns=1, path=PATH, cpus=rest)
        traced = _load(svc, seconds, col, cpus=rest)
    finally:
        summary = col.stop()
    after = _load(svc, seconds, cpus=rest)
    base = (before["rps"] + after["rps"]) / 2
    return {"service_cpus": sorted(own) if own else None,
            "rps_without": [before["rps"], after["rps"]], "rps_with": traced["rps"], "errors": traced["errors"],
            "requests_traced": summary.get("requests", 0),
            "added_us": (1 / max(traced["rps"], 1e-9) - 1 / max(base, 1e-9)) * 1e6,
            "service_us": [before["service_us"], traced["service_us"], after["service_us"]],
            "service_added_us": traced["service_us"] - (before["service_us"] + after["service_us"]) / 2,
            "collector_us": traced["collector_us"]}


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
    seconds = 2 if quick else 6
    out: dict = {"seconds": seconds, "path": PATH}
    with tempfile.TemporaryDirectory() as d:
        cert = _certificate(Path(d))
        for name, args in (("https", ("--tls", cert)), ("http", ())):
            svc = Service(args)
            try:
                out[name] = _phases(svc, seconds, starts)
            finally:
                svc.stop()
        out["round_trip"] = _loop_phases(cert, 5_000 if quick else 20_000, starts)
    out["ssl_probes_us"] = out["https"]["service_added_us"] - out["http"]["service_added_us"]
    return out


def rows(r: dict) -> list:
    out = []
    for name in ("https", "http"):
        m = r[name]
        out.append(("9", f"{name.upper()} {r['path']}, 1 connection: req/s without/with/without the collector",
                    f"{m['rps_without'][0]:.0f}/{m['rps_with']:.0f}/{m['rps_without'][1]:.0f}", "", None))
        out.append(("9", f"  {name.upper()}: wall us added per request; the collector's CPU us per request "
                         f"(it finished {m['requests_traced']} requests)",
                    f"{m['added_us']:+.1f}; {m['collector_us']:.1f}", "", None))
        sv = m["service_us"]
        out.append(("9", f"  {name.upper()}: service CPU us per request without/with/without; added",
                    f"{sv[0]:.1f}/{sv[1]:.1f}/{sv[2]:.1f}; {m['service_added_us']:+.1f}", "", None))
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
