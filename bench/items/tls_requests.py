"""Item 9: what the OpenSSL probes (bpf/tls_probes.c) cost per HTTPS request. The bench
service (stdlib ThreadingHTTPServer, real libcudart) serves GET /launch/0 (no CUDA
call: the HTTP path alone) over HTTPS and over cleartext, one keep-alive connection,
each without the collector, with it (default mode), and without it again. The added
time per request is 1/rps(with) - 1/rps(without); HTTPS adds the SSL_read_ex/
SSL_write_ex uprobes (entry + return) to what cleartext pays, so the difference of
the two added times is the SSL probes' own share. Then the probes' cost per call alone,
steadier than req/s on a shared machine: bench/tls_loop.py's TLS round trips (one
SSL_write_ex and one SSL_read_ex each, one thread), its CPU time per round trip without,
with and without the collector again (probes/tls_entries.py: where the probes sit)."""
from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

from ..collector import Collector
from ..target import Service

PATH = "/launch/0"


def _certificate(d: Path) -> str:
    cert, key = d / "cert.pem", d / "key.pem"
    subprocess.run(["openssl", "req", "-x509", "-newkey", "rsa:2048", "-nodes", "-days", "1", "-subj",
                    "/CN=127.0.0.1", "-keyout", str(key), "-out", str(cert)], check=True, capture_output=True,
                   timeout=60)
    return f"{cert},{key}"


def _phases(svc: Service, seconds: float, starts: list) -> dict:
    svc.load(1, conns=1, path=PATH)  # warm-up
    before = svc.load(seconds, conns=1, path=PATH)
    col = Collector()
    starts.append(col.ready_s)
    try:
        col.wait_traced(svc.pid)
        svc.load(1, conns=1, path=PATH)
        traced = svc.load(seconds, conns=1, path=PATH)
    finally:
        summary = col.stop()
    after = svc.load(seconds, conns=1, path=PATH)
    base = (before["rps"] + after["rps"]) / 2
    return {"rps_without": [before["rps"], after["rps"]], "rps_with": traced["rps"], "errors": traced["errors"],
            "requests_traced": summary.get("requests", 0),
            "added_us": (1 / max(traced["rps"], 1e-9) - 1 / max(base, 1e-9)) * 1e6}


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
    out["ssl_probes_us"] = out["https"]["added_us"] - out["http"]["added_us"]
    return out


def rows(r: dict) -> list:
    out = []
    for name in ("https", "http"):
        m = r[name]
        out.append(("9", f"{name.upper()} {r['path']}, 1 connection: req/s without/with/without the collector",
                    f"{m['rps_without'][0]:.0f}/{m['rps_with']:.0f}/{m['rps_without'][1]:.0f}", "", None))
        out.append(("9", f"  {name.upper()}: us added per request (collector finished {m['requests_traced']} requests)",
                    f"{m['added_us']:+.1f}", "", None))
    https, http = r["https"]["added_us"], r["http"]["added_us"]
    out.append(("9", "SSL probes' share per HTTPS request (us; HTTPS added - HTTP added)",
                f"{r['ssl_probes_us']:+.1f}", "HTTPS <= 2x HTTP", https <= 2 * max(http, 0.0)))
    t = r.get("round_trip")
    if t:
        out.append(("9", "TLS round trip (SSL_write_ex + SSL_read_ex), thread CPU us: without/with/without",
                    f"{t['us_without'][0]:.1f}/{t['us_with']:.1f}/{t['us_without'][1]:.1f}", "", None))
        out.append(("9", "  the SSL probes per round trip (us added; two single-steps would be ~20)",
                    f"{t['added_us']:+.1f}", "", None))
    return out
