"""Lifecycle and safety: the collector refuses to start with one clear line (not root,
no kernel headers, invalid configuration), and never exports secrets: query strings,
Authorization/Cookie values and bodies stay out of every span and resource unless
configured (--export-query, --export-header NAME)."""
from __future__ import annotations

import os
import re
import signal
import socket
import subprocess
import sys

import pytest

from tests.harness import ROOT, TARGETS, Target, server_spans

PY = sys.executable


def _cli(args: list, env: dict | None = None, prefix: list | None = None, drop_env=(), timeout: float = 40):
    """Runs `otel-gpu run ARGS`; returns (exit code, non-empty stderr lines). A collector
    that starts instead of refusing is stopped with SIGTERM (probes detached) and fails."""
    full_env = {k: v for k, v in dict(os.environ, **(env or {})).items() if k not in drop_env}
    proc = subprocess.Popen([*(prefix or []), PY, "-m", "otel_gpu.cli", "run", "--no-console", *args],
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=full_env, cwd=ROOT)
    try:
        _, err = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        proc.send_signal(signal.SIGTERM)
        _, err = proc.communicate(timeout=60)
        pytest.fail(f"collector started instead of refusing {args} {env}:\n{err[-2000:]}")
    return proc.returncode, [l for l in err.splitlines() if l.strip()]


def test_not_root_exits_with_one_line():
    rc, lines = _cli([], prefix=["setpriv", "--reuid=65534", "--regid=65534", "--clear-groups"])
    assert rc != 0
    assert len(lines) == 1 and "needs root" in lines[0], lines


def test_missing_kernel_headers_names_bcc_kernel_source():
    rc, lines = _cli([], {"BCC_KERNEL_SOURCE": "/nonexistent"})
    assert rc != 0
    assert len(lines) == 1 and "BCC_KERNEL_SOURCE" in lines[0], lines


def test_kernel_headers_directory_without_headers(tmp_path):
    rc, lines = _cli([], {"BCC_KERNEL_SOURCE": str(tmp_path)})
    assert rc != 0
    assert len(lines) == 1 and "BCC_KERNEL_SOURCE" in lines[0], lines[:5]


ENDPOINT = {"OTEL_EXPORTER_OTLP_ENDPOINT": "http://127.0.0.1:9"}


@pytest.mark.parametrize("args, env, field", [
    (["--span-budget", "-1"], {}, r"span[_-]budget"),
    (["--gpu-price", "H100=abc"], {}, r"gpu[_-]price"),
    ([], dict(ENDPOINT, OTEL_EXPORTER_OTLP_PROTOCOL="carrier-pigeon"), r"OTEL_EXPORTER_OTLP_PROTOCOL"),
    (["--ringbuf-pages", "3"], {}, r"ringbuf[_-]pages"),
    (["--prometheus-port", "70000"], {}, r"prometheus[_-]port"),
    pytest.param([], {"OTEL_RESOURCE_ATTRIBUTES": "novalue"}, r"OTEL_RESOURCE_ATTRIBUTES"),
], ids=["span-budget", "gpu-price", "otlp-protocol", "ringbuf-pages", "prometheus-port", "resource-attributes"])
def test_invalid_configuration_exits_2_with_one_line(args, env, field):
    rc, lines = _cli(args, env)
    assert rc == 2, (rc, lines[-5:])
    assert len(lines) == 1 and re.search(field, lines[0]), lines[-5:]


@pytest.mark.parametrize("name", ["OTEL_GPU_SPAN_BUDGET", "OTEL_GPU_RINGBUF_PAGES", "OTEL_GPU_PROMETHEUS_PORT"])
def test_invalid_numeric_environment_exits_2_with_one_line(name):
    rc, lines = _cli([], {name: "abc"})
    assert rc == 2 and len(lines) == 1 and name in lines[0], (rc, lines[-3:])


def test_invalid_otlp_protocol_without_endpoint_exits_2():
    rc, lines = _cli([], {"OTEL_EXPORTER_OTLP_PROTOCOL": "carrier-pigeon"}, timeout=15,
                     drop_env=("OTEL_EXPORTER_OTLP_ENDPOINT", "OTEL_EXPORTER_OTLP_TRACES_ENDPOINT"))
    assert rc == 2 and len(lines) == 1 and "OTEL_EXPORTER_OTLP_PROTOCOL" in lines[0], (rc, lines[-3:])


# --- redaction -------------------------------------------------------------------
SECRETS = {"query": "QSECRET-1b2c3d", "authorization": "ASECRET-9f8e7d", "cookie": "CSECRET-7a6b5c",
           "body": "BSECRET-5d4c3b"}
TENANT = "tenant-42x"
QUERY = f"launches=1&api_key={SECRETS['query']}"


def _secret_request(port: int) -> bytes:
    body = f"user=alice&password={SECRETS['body']}".encode()
    head = (f"POST /work?{QUERY} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {SECRETS['authorization']}\r\n"
            f"Cookie: session={SECRETS['cookie']}\r\nX-Tenant: {TENANT}\r\nConnection: close\r\n"
            f"Content-Type: application/x-www-form-urlencoded\r\nContent-Length: {len(body)}\r\n\r\n").encode()
    with socket.create_connection(("127.0.0.1", port), timeout=10) as s:
        s.sendall(head + body)
        reply = b""
        while chunk := s.recv(4096):
            reply += chunk
    return reply


def _exported_text(spans) -> str:
    """Every name, attribute and resource value of every span, as one string."""
    return repr([(s.name, s.attributes, s.resource, s.links) for s in spans])


def _traced_secret_request(receiver, start_collector, *args):
    collector = start_collector("--exe", "relia_redact", *args)
    target = Target([PY, str(TARGETS / "slow_http.py"), "0"], {"RELIA_COMM": "relia_redact"})
    try:
        collector.wait_traced(target.pid)
        target.go()
        assert _secret_request(target.port).startswith(b"HTTP/1.1 200")
        assert receiver.wait_for(lambda s: any(x.attributes["url.path"] == "/work"
                                               for x in server_spans(s, target.pid)))
        assert collector.stop() == 0  # everything flushed: windows, resources, children
    finally:
        target.stop()
    (span,) = [x for x in server_spans(receiver.spans, target.pid) if x.attributes["url.path"] == "/work"]
    assert span.attributes["http.request.method"] == "POST" and span.attributes["gpu.launches"] == 1
    return span


def _assert_absent(spans, values):
    text = _exported_text(spans)
    for v in values:
        assert v not in text, f"{v!r} exported"


def test_redaction_by_default(receiver, start_collector):
    span = _traced_secret_request(receiver, start_collector)
    assert "url.query" not in span.attributes
    assert not [k for k in span.attributes if k.startswith("http.request.header.")]
    _assert_absent(receiver.spans, [*SECRETS.values(), TENANT])


def test_export_query_exports_url_query_only(receiver, start_collector):
    span = _traced_secret_request(receiver, start_collector, "--export-query")
    assert span.attributes["url.query"] == QUERY
    assert not [k for k in span.attributes if k.startswith("http.request.header.")]
    _assert_absent(receiver.spans, [SECRETS["authorization"], SECRETS["cookie"], SECRETS["body"], TENANT])


def test_export_header_exports_that_header_only(receiver, start_collector):
    span = _traced_secret_request(receiver, start_collector, "--export-header", "X-Tenant")
    assert span.attributes["http.request.header.x-tenant"] == [TENANT]
    assert [k for k in span.attributes if k.startswith("http.request.header.")] == ["http.request.header.x-tenant"]
    assert "url.query" not in span.attributes
    _assert_absent(receiver.spans, SECRETS.values())
