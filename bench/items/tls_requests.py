"""Item 9: what the OpenSSL probes (bpf/tls_probes.c) cost per HTTPS request. The bench
service (stdlib ThreadingHTTPServer, real libcudart) serves GET /launch/0 (no CUDA
call: the HTTP path alone) over HTTPS and over cleartext, one keep-alive connection,
each without the collector, with it (default mode), and without it again. The added
time per request is 1/rps(with) - 1/rps(without); HTTPS adds the SSL_read_ex/
SSL_write_ex uprobes (entry + return) to what cleartext pays, so the difference of
the two added times is the SSL probes' own share."""
from __future__ import annotations

import subprocess
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


def run(quick: bool, starts: list) -> dict:
    seconds = 2 if quick else 6
    out: dict = {"seconds": seconds, "path": PATH}
    with tempfile.TemporaryDirectory() as d:
        for name, args in (("https", ("--tls", _certificate(Path(d)))), ("http", ())):
            svc = Service(args)
            try:
                out[name] = _phases(svc, seconds, starts)
            finally:
                svc.stop()
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
    out.append(("9", "SSL probes' share per HTTPS request (us; HTTPS added - HTTP added)",
                f"{r['ssl_probes_us']:+.1f}", "", None))
    return out
