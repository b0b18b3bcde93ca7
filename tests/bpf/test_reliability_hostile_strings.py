"""Hostile strings through the real probes and a real server: terminal escape sequences
(ESC[2J, OSC 0 window title, BEL, C1 CSI 0x9b) and bytes that are not UTF-8 in a request
path, an exported header and the traced process's OTEL_SERVICE_NAME reach the console
tree, the store, `otel-gpu traces`/`report` and OTLP only neutralised (U+FFFD); secrets in
an absolute-form target's userinfo, in the traced process's command line and in
malformed request lines appear in no output and not in the collector's log; a request
the server rejects with 400 keeps its status and a safe path."""
from __future__ import annotations

import json
import os
import sqlite3
import subprocess
import sys

import pytest

from tests.bpf.targets.relia_support import TARGETS, stopped_counters
from tests.bpf.test_reliability_bad_input import _send_and_close
from tests.harness import ROOT, Target, children_of, server_spans

R = "\ufffd"
COMM = "relia_hostile"
SECRETS = ("PWSECRET7", "APIKEYSECRET7", "QSECRET7", "LSECRET7")
SERVICE_RAW = b"svc\x1b]0;pwned\x07\x1b[2J\x9b\xff"   # OTEL_SERVICE_NAME, bytes as set
SERVICE = f"svc{R}]0;pwned{R}{R}[2J{R}{R}"             # as exported
PATH_RAW = b"/hostile/\x1b[2J\x1b]0;pwned\x07/\x9b31m\xff\xfe"
PATH = f"/hostile/{R}[2J{R}]0;pwned{R}/{R}31m{R}{R}"
NOTE_RAW = b"\x1b[31mred\x07\xc3\x28"                 # X-Note header value
NOTE = f"{R}[31mred{R}{R}("
REJECTED_RAW = b"/bad\x1cpath\x1b[2J"                 # stdlib splits on \x1c: 400 Bad request syntax
REJECTED = f"/bad{R}path{R}[2J"


def controls(text: str) -> list:
    """Control characters other than newline (C0, DEL, C1)."""
    return [c for c in text if c != "\n" and (ord(c) < 0x20 or 0x7f <= ord(c) <= 0x9f)]


def secrets_in(text: str) -> list:
    return [s for s in SECRETS if s in text]


@pytest.fixture
def hostile_target():
    """slow_http.py named relia_hostile (the collector traces it alone, --exe), with an
    API key on its command line and escape sequences in its OTEL_SERVICE_NAME."""
    t = Target([sys.executable, str(TARGETS / "slow_http.py"), "0", f"--api-key={SECRETS[1]}"],
               {"RELIA_COMM": COMM, "OTEL_SERVICE_NAME": os.fsdecode(SERVICE_RAW)})
    yield t
    t.stop()


def _cli(*argv: str) -> str:
    done = subprocess.run([sys.executable, "-m", "otel_gpu.cli", *argv], capture_output=True, text=True,
                          cwd=ROOT, timeout=60)
    assert done.returncode == 0, done.stderr
    return done.stdout


def _strings(span) -> str:
    return json.dumps([span.name, span.attributes, span.resource], ensure_ascii=False, default=str)


def test_hostile_strings_are_neutralised_and_secrets_never_leave(receiver, start_collector, hostile_target,
                                                                 tmp_path, capfd):
    db = str(tmp_path / "store.db")
    collector = start_collector("--exe", COMM, "--export-header", "X-Note", "--store", db, "--console",
                                "--log-level", "debug")
    target = hostile_target
    collector.wait_traced(target.pid)
    target.go()
    port = target.port
    close = b"Host: x\r\nConnection: close\r\n"
    replies = [
        _send_and_close(port, [b"GET " + PATH_RAW + b" HTTP/1.1\r\nX-Note: " + NOTE_RAW + b"\r\n" + close + b"\r\n"],
                        linger=5),
        _send_and_close(port, [f"GET http://user:{SECRETS[0]}@127.0.0.1:{port}/work?launches=2 HTTP/1.1\r\n"
                               .encode() + close + b"\r\n"], linger=5),
        _send_and_close(port, [b"GET " + REJECTED_RAW + b" HTTP/1.1\r\n" + close + b"\r\n"], linger=5),
        # Refused by the collector's framer (HTTP/1.2; no method): logged, never with the query.
        _send_and_close(port, [f"GET /x?token={SECRETS[2]} HTTP/1.2\r\n".encode() + close + b"\r\n"], linger=1),
        _send_and_close(port, [f"get /?k={SECRETS[3]} HTTP/1.1\r\n".encode() + close + b"\r\n"], linger=1),
    ]
    assert [r[:12] for r in replies[:3]] == [b"HTTP/1.1 404", b"HTTP/1.1 200", b"HTTP/1.1 400"], replies
    want = sorted([(PATH, 404), ("/work", 200), (REJECTED, 400)])

    def served(spans):
        return sorted((s.attributes["url.path"], s.attributes["http.response.status_code"])
                      for s in server_spans(spans, target.pid) if s.attributes["url.path"] != "/nothing")
    assert receiver.wait_for(lambda spans: len(served(spans)) >= 3, 30), served(receiver.spans)
    assert collector.stop() == 0
    counters = stopped_counters(collector)
    assert served(receiver.spans) == want
    # The two refused heads, counted: HTTP/1.2 by the HTTP/1 framer, "get" by no protocol.
    assert counters.get("http_parse_errors", 0) == 1, counters
    assert counters.get("connections_unknown_protocol", 0) == 1, counters

    # OTLP: exact neutralised values; nothing else of ours carries a control character.
    by_path = {s.attributes["url.path"]: s for s in server_spans(receiver.spans, target.pid)}
    hostile, work, rejected = by_path[PATH], by_path["/work"], by_path[REJECTED]
    assert hostile.attributes["http.request.header.x-note"] == [NOTE]
    assert hostile.resource["service.name"] == SERVICE
    assert work.attributes["gpu.launches"] == 2 and len(children_of(receiver.spans, work)) == 2
    assert rejected.attributes["http.response.status_code"] == 400
    assert "process.command_line" not in hostile.resource
    assert hostile.resource["process.executable.name"].startswith("python")
    ours = [s for s in receiver.spans if s.resource.get("process.pid") == target.pid]
    for s in ours:
        assert not controls(_strings(s)) and not secrets_in(_strings(s)), _strings(s)
        assert "user:" not in _strings(s)

    # Console tree (the collector's stdout).
    console = capfd.readouterr().out
    assert f"[{SERVICE}] trace" in console, console[-2000:]
    assert not controls(console) and not secrets_in(console)

    # The store: no secret anywhere in its bytes; no control character in its text.
    raw = b"".join(open(p, "rb").read() for p in (db, db + "-wal") if os.path.exists(p))
    assert not [s for s in SECRETS if s.encode() in raw] and b"user:" not in raw
    conn = sqlite3.connect(db)
    texts = [v for table in ("requests", "spans") for row in conn.execute(f"SELECT * FROM {table}")
             for v in row if isinstance(v, str)]
    conn.close()
    assert texts and not controls("".join(texts)) and any(SERVICE in t for t in texts)

    # The readers.
    listed = _cli("traces", "--db", db, "--limit", "50")
    tree = _cli("traces", "--db", db, "--trace-id", hostile.trace_id)
    report = _cli("report", "--db", db)
    report_json = _cli("report", "--db", db, "--format", "json")
    assert SERVICE in listed and f"[{SERVICE}] trace" in tree and SERVICE in report
    assert SERVICE in json.dumps(json.loads(report_json), ensure_ascii=False)
    for out in (listed, tree, report, report_json):
        assert not controls(out) and not secrets_in(out), out

    # The collector's log: a refused head is described (the second one's line is rate-limited,
    # its count is above), never shown.
    log = "".join(collector.log.lines)
    assert "bad request line (GET, " in log, log[-3000:]
    assert not secrets_in(log) and "user:" not in log
    assert "\x1b" not in log and "\x9b" not in log
