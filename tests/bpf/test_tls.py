"""HTTPS through the OpenSSL probes (bpf/tls_probes.c), against real servers: uvicorn
with a self-signed certificate on asyncio and on uvloop (memory BIO: the SSL* is tied
to the connection the loop thread last read), and a stdlib ThreadingHTTPServer on an
ssl-wrapped socket (socket BIO: tied by the read() inside SSL_read). Each request's
CUDA calls encode its id (tests/bpf/targets/tls_servers.py), so every span is checked:
one server span per request, its route and status, exactly its own K launches and
one copy. Also: TLS records split across reads (a request written a few bytes at a
time, a 256 KiB body), and a cleartext server traced by the same collector, unaffected."""
from __future__ import annotations

import os
import socket
import ssl
import sys
import time

import pytest

from tests.bpf.load_client import fetch_all
from tests.bpf.test_async_attribution import K, Check, wait_for_ids
from tests.harness import TARGETS, Target, module_collector, server_spans

LEVELS = {1: 20, 8: 48}  # clients -> requests at that level
SECONDS = 60             # time bound of one level's load
BIG_BODY = 256 * 1024
SELECTED = f"tlsexact{os.getpid() % 100000}"  # the process name --exe selects (15 characters at most)


def client_context() -> ssl.SSLContext:
    ctx = ssl.create_default_context()
    ctx.check_hostname = False
    ctx.verify_mode = ssl.CERT_NONE  # self-signed
    return ctx


def start_https(collector, kind: str, certificate) -> Target:
    target = Target([sys.executable, str(TARGETS / "tls_servers.py"), kind, "0", *certificate])
    collector.wait_traced(target.pid)
    return start_https_serving(target)


def start_https_serving(target: Target) -> Target:
    """Lets the target serve, and waits until it answers over TLS."""
    target.go_raw()
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:  # binds before "listening", serves after go
        try:
            fetch_one(target.port, b"GET /nothing HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n")
            return target
        except OSError:
            time.sleep(0.2)
    target.stop()
    raise RuntimeError("https target not serving")


def fetch_one(port: int, request: bytes, piece: int = 0) -> bytes:
    """One request on its own TLS connection, written whole or `piece` bytes per TLS
    record; returns the whole response (the server closes: Connection: close)."""
    with socket.create_connection(("127.0.0.1", port), timeout=20) as raw:
        raw.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        with client_context().wrap_socket(raw) as s:
            step = piece or len(request)
            for i in range(0, len(request), step):
                s.sendall(request[i:i + step])  # one TLS record per call
                if piece:
                    time.sleep(0.002)  # so the server's reads see them apart
            out = b""
            while chunk := s.recv(65536):
                out += chunk
            return out


@pytest.fixture(scope="class")
def selected():
    """One collector for the class's three servers, tracing only the processes named
    SELECTED (--exe: per-process probes, as with --pid). Not host-wide: a host-wide
    collector also exports every other CUDA process's spans, and a neighbour's flood can
    fill its export queue (tests on a shared machine)."""
    with module_collector("--export-query", "--exe", SELECTED) as collector:
        yield collector


class TestOneCollector:
    """A class: its collector stops before the module's next tests start their own."""

    @pytest.mark.parametrize("kind", ["uvicorn", "uvloop", "threaded"])
    def test_https_requests_are_exact_at_1_and_8_clients(self, kind, certificate, selected, targets):
        collector, receiver = selected, selected.receiver
        target = Target([sys.executable, str(TARGETS / "tls_servers.py"), kind, "0", *certificate],
                        {"TARGET_COMM": SELECTED})
        targets.append(target)
        collector.wait_traced(target.pid)
        start_https_serving(target)
        tls = client_context()
        first = 1
        for clients, n in LEVELS.items():
            ids = list(range(first, first + n))
            first += n
            out = fetch_all(target.port, [f"/infer?id={i}&launches={K}" for i in ids], clients, SECONDS, tls=tls)
            assert len(out.ok) == n, out.errors[:3]
            wait_for_ids(receiver, target.pid, ids)
            check = Check(receiver.spans, target.pid, ids)
            assert not check.wrong, check.wrong[:5]
            assert check.exact == n, f"{kind} {clients} clients: {check.not_exact[:5]}"
            for rid in ids:
                span = check.by_id[rid][0]
                assert span.name == "GET /infer"
                assert span.attributes["http.response.status_code"] == 200
                assert span.attributes["http.route"] == "/infer"
                assert span.attributes["url.scheme"] == "https"


def test_https_with_per_process_probes(certificate, receiver, start_collector, targets):
    """--pid: the target's libssl gets probes of its own (no file-wide ones)."""
    target = Target([sys.executable, str(TARGETS / "tls_servers.py"), "uvloop", "0", *certificate])
    targets.append(target)
    collector = start_collector("--export-query", "--pid", str(target.pid))
    assert collector.log.wait_for("libssl.so", 30)  # attached after its CUDA and Python probes
    ssl_lines = [l for l in collector.log.lines if "libssl.so" in l and "attached" in l]
    assert ssl_lines and all(f"for pid {target.pid} only" in l for l in ssl_lines), ssl_lines
    # Reads and writes probed where they all go through (probes/tls_entries.py), never on the
    # single-stepped public entries; the attach log names what x86 still single-steps.
    stepped = [l for l in collector.log.lines if "single-stepped" in l and "libssl.so" in l]
    assert [l for l in stepped if "SSL_free in" in l], stepped  # once a connection; it starts with a test
    assert not [l for l in stepped if "SSL_read" in l or "SSL_write" in l], stepped
    start_https_serving(target)
    ids = list(range(1, 11))
    out = fetch_all(target.port, [f"/infer?id={i}&launches={K}" for i in ids], 2, SECONDS, tls=client_context())
    assert len(out.ok) == len(ids), out.errors[:3]
    wait_for_ids(receiver, target.pid, ids)
    check = Check(receiver.spans, target.pid, ids)
    assert not check.wrong and check.exact == len(ids), check.not_exact[:5]


@pytest.fixture(scope="module")
def host_wide():
    """One host-wide collector for the two tests below (they need no fresh one); the last
    tests of the module, so that no other collector of this module runs beside it."""
    with module_collector("--export-query") as collector:
        yield collector


def test_tls_records_split_across_reads_and_a_large_body(certificate, host_wide, targets):
    """A request head written 5 bytes per TLS record (one SSL_read each on the server),
    and a 256 KiB POST body (16 KiB records, many reads): one exact span each."""
    collector, receiver = host_wide, host_wide.receiver
    target = start_https(collector, "threaded", certificate)
    targets.append(target)
    head = f"GET /infer?id=7&launches={K} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n".encode()
    assert fetch_one(target.port, head, piece=5).endswith(b"ok 7\n")
    body = bytes(range(256)) * (BIG_BODY // 256)
    post = (f"POST /infer?id=8&launches={K} HTTP/1.1\r\nHost: x\r\nConnection: close\r\n"
            f"Content-Length: {len(body)}\r\n\r\n").encode() + body
    assert fetch_one(target.port, post).endswith(f"ok 8 len {BIG_BODY}\n".encode())
    wait_for_ids(receiver, target.pid, [7, 8])
    check = Check(receiver.spans, target.pid, [7, 8])
    assert not check.wrong and check.exact == 2, check.not_exact
    assert check.by_id[8][0].name == "POST /infer"
    assert len(server_spans(receiver.spans, target.pid)) == 3  # + start_https's /nothing (404)


def test_a_cleartext_server_beside_an_https_one_is_unaffected(certificate, host_wide, targets):
    collector, receiver = host_wide, host_wide.receiver
    https = start_https(collector, "uvicorn", certificate)
    targets.append(https)
    plain = Target([sys.executable, str(TARGETS / "async_servers.py"), "fastapi-async", "0"])
    targets.append(plain)
    collector.wait_traced(plain.pid)
    plain.go()
    ids_tls, ids_plain = list(range(1, 17)), list(range(101, 117))
    out_tls = fetch_all(https.port, [f"/infer?id={i}&launches={K}" for i in ids_tls], 4, SECONDS,
                        tls=client_context())
    out_plain = fetch_all(plain.port, [f"/infer?id={i}&launches={K}" for i in ids_plain], 4, SECONDS)
    assert len(out_tls.ok) == len(ids_tls) and len(out_plain.ok) == len(ids_plain)
    wait_for_ids(receiver, https.pid, ids_tls)
    wait_for_ids(receiver, plain.pid, ids_plain)
    for pid, ids, scheme in ((https.pid, ids_tls, "https"), (plain.pid, ids_plain, "http")):
        check = Check(receiver.spans, pid, ids)
        assert not check.wrong and check.exact == len(ids), check.not_exact[:5]
        assert {s.attributes["url.scheme"] for s in server_spans(receiver.spans, pid)} == {scheme}
