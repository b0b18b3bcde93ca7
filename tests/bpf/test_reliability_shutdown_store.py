"""Shutdown, the local store and exposure, through the real collector subprocess:
- an OTLP endpoint that accepts TCP and never answers (gRPC and HTTP/protobuf): SIGTERM
  still exits within --shutdown-timeout, printing the stopped: line with the spans it
  could not deliver counted;
- a store on a full tmpfs: one line with the real cause, OTLP unaffected (or exit 2 when
  the store is the only destination); a tmpfs that fills mid-run: failed writes counted,
  no crash, every span still reaches OTLP;
- the store's modes (0600/0700, or 0640/0750 + --store-group, readable by that group's
  members with `otel-gpu report`); Prometheus bound to 127.0.0.1 unless told otherwise."""
from __future__ import annotations

import json
import os
import re
import signal
import socket
import stat
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request
from pathlib import Path

import pytest

from otel_gpu.demo.runner import free_port
from tests.bpf.targets.relia_support import TARGETS, stopped_counters, wait_until
from tests.harness import ROOT, Target, server_spans

SHUTDOWN_S = 5   # --shutdown-timeout given below (the default)
NOBODY = 65534
SYSTEM_PYTHON = "/usr/bin/python3"
READERS_GID = 4242  # a gid /etc/group need not list: the kernel checks numbers


class Blackhole:
    """A backend that hangs: a TCP listener on 127.0.0.1 that accepts every connection
    and never sends a byte (neither an HTTP/2 SETTINGS frame nor an HTTP response)."""

    def __init__(self) -> None:
        self.sock = socket.socket()
        self.sock.bind(("127.0.0.1", 0))
        self.sock.listen(64)
        self.port = self.sock.getsockname()[1]
        self.conns: list = []
        threading.Thread(target=self._accept, daemon=True).start()

    def _accept(self) -> None:
        while True:
            try:
                self.conns.append(self.sock.accept()[0])
            except OSError:
                return

    def close(self) -> None:
        self.sock.close()
        for c in self.conns:
            c.close()


def _target(collector, name: str, started: list) -> Target:
    """slow_http.py renamed to `name`, traced alone with --exe name."""
    t = Target([sys.executable, str(TARGETS / "slow_http.py"), "0"], {"RELIA_COMM": name})
    started.append(t)
    collector.wait_traced(t.pid)
    t.go()
    return t


def _work(receiver, pid: int, launches: int) -> list:
    return [s for s in server_spans(receiver.spans, pid) if s.attributes["gpu.launches"] == launches]


def _tracebacks(collector) -> list:
    return [l for l in collector.log.lines if "Traceback" in l]


@pytest.fixture
def tmpfs():
    """mount(size): a tmpfs of that size, 0755 so a non-root reader may traverse it."""
    mounts = []

    def mount(size: str) -> Path:
        d = Path(tempfile.mkdtemp(prefix="otel-gpu-store-", dir="/tmp"))
        subprocess.run(["mount", "-t", "tmpfs", "-o", f"size={size},mode=0755", "tmpfs", str(d)], check=True)
        mounts.append(d)
        return d
    yield mount
    for d in mounts:
        subprocess.run(["umount", "-l", str(d)], check=False)
        d.rmdir()


def _fill(d: Path) -> None:
    """Writes zeros into d until the filesystem says it is full."""
    with open(d / "ballast", "wb") as f:
        try:
            for _ in range(100_000):  # bounded: 6 GiB at most, a tmpfs is far smaller
                f.write(b"\0" * 65536)
                f.flush()
        except OSError as e:
            assert e.errno == 28, e  # ENOSPC


# --- shutdown ------------------------------------------------------------------------

class Load:
    """Requests to the target from LOAD_CLIENTS threads until stopped (LOAD_MAX_S at
    most), each on its own connection; errors (the collector's stop does not touch the
    target, but a test may stop it) end that client."""

    def __init__(self, target: Target) -> None:
        self.done = threading.Event()
        self.sent = 0
        self.threads = [threading.Thread(target=self._client, args=(target,), daemon=True)
                        for _ in range(LOAD_CLIENTS)]
        for t in self.threads:
            t.start()

    def _client(self, target: Target) -> None:
        end = time.monotonic() + LOAD_MAX_S
        while not self.done.is_set() and time.monotonic() < end:
            try:
                target.get("/work?launches=2")
            except OSError:
                return
            self.sent += 1

    def stop(self) -> None:
        self.done.set()
        for t in self.threads:
            t.join(30)


LOAD_CLIENTS, LOAD_MAX_S = 4, 120
FLOOD = 400  # idle connections the traced service holds at the stop


@pytest.mark.parametrize("protocol,flood", [("grpc", False), ("http/protobuf", False), ("grpc", True)])
def test_sigterm_exits_in_time_with_a_backend_that_never_answers(protocol, flood, start_collector, targets):
    """SIGTERM under load (4 clients sending requests throughout), with an OTLP backend
    that never answers and, for `flood`, FLOOD idle connections to the traced service:
    the collector exits within --shutdown-timeout + 1 s, its probes detached."""
    hole = Blackhole()
    name = "relia_bh_" + protocol[:4].replace("/", "")
    idle: list = []
    try:
        collector = start_collector("--exe", name, "--shutdown-timeout", str(SHUTDOWN_S),
                                    allow_errors=("Failed to export",),  # the backend never answers
                                    OTEL_EXPORTER_OTLP_ENDPOINT=f"http://127.0.0.1:{hole.port}",
                                    OTEL_EXPORTER_OTLP_PROTOCOL=protocol,
                                    OTEL_EXPORTER_OTLP_TIMEOUT="60")  # each export would hang 60 s
        target = _target(collector, name, targets)
        for _ in range(20):
            target.get("/work?launches=2")
        if flood:
            idle = [socket.create_connection(("127.0.0.1", target.port), timeout=10) for _ in range(FLOOD)]
        load = Load(target)
        # The exporter has connected and waits for an answer that never comes.
        assert wait_until(lambda: hole.conns, 20), "the exporter never connected"
        assert wait_until(lambda: load.sent >= 20, 20), "no load"
        t0 = time.monotonic()
        collector.proc.send_signal(signal.SIGTERM)
        try:
            rc = collector.proc.wait(120)  # the bound is checked below; this only ends a hung test
        except subprocess.TimeoutExpired:
            pytest.fail("still running 120 s after SIGTERM:\n" + "".join(collector.log.lines[-15:]))
        elapsed = time.monotonic() - t0
        load.stop()
        assert rc == 0, "".join(collector.log.lines[-15:])
    finally:
        for c in idle:
            c.close()
        hole.close()
    detach_s = float(re.search(r"probes detached \(([\d.]+) s\)", "".join(collector.log.lines)).group(1))
    print(f"{protocol}{' after a flood' if flood else ''}: SIGTERM to exit {elapsed:.2f} s under load "
          f"({load.sent} requests sent; probes detached in {detach_s} s)")
    assert elapsed <= SHUTDOWN_S + 1
    counters = stopped_counters(collector)
    print(counters)
    assert counters["requests"] >= 20
    assert counters.get("spans_exported", 0) == 0  # nothing can have been delivered
    assert counters.get("spans_dropped_shutdown", 0) > 0, counters
    assert counters.get("metrics_dropped_shutdown", 0) >= 1, counters  # the final metrics export hung too
    handed = sum(counters.get(k, 0) for k in ("spans_export_failed", "spans_dropped_queue_full",
                                              "spans_dropped_shutdown"))
    assert handed == counters["spans"], counters  # every span is accounted for, once
    assert any("not delivered by the shutdown deadline" in l for l in collector.log.lines)
    assert not _tracebacks(collector), _tracebacks(collector)


# --- the store -----------------------------------------------------------------------

def test_store_on_a_full_disk_at_start_is_one_line_and_otlp_goes_on(receiver, start_collector, targets, tmpfs):
    d = tmpfs("1m")
    _fill(d)
    db = d / "otel-gpu.db"
    collector = start_collector("--exe", "relia_fullst", "--store", str(db), allow_errors=("cannot be written",))
    errors = [l for l in collector.log.lines if "cannot be written" in l]
    assert len(errors) == 1 and str(db) in errors[0] and "database or disk is full" in errors[0], errors
    assert "spans still go to otlp" in errors[0]
    target = _target(collector, "relia_fullst", targets)
    target.get("/work?launches=3")
    assert receiver.wait_for(lambda s: len(_work(receiver, target.pid, 3)) == 1, 20), collector.log.lines[-10:]
    assert collector.stop() == 0
    assert stopped_counters(collector).get("store_disabled") == 1
    assert not _tracebacks(collector), _tracebacks(collector)


def test_store_that_is_the_only_destination_and_full_exits_2_with_one_line(tmpfs):
    d = tmpfs("1m")
    _fill(d)
    db = d / "otel-gpu.db"
    env = {k: v for k, v in os.environ.items() if not k.startswith("OTEL_EXPORTER_OTLP")}
    proc = subprocess.run([sys.executable, "-m", "otel_gpu.cli", "run", "--no-console", "--store", str(db)],
                          capture_output=True, text=True, env=env, cwd=ROOT, timeout=60)
    assert proc.returncode == 2, proc.stderr
    errors = [l for l in proc.stderr.splitlines() if "ERROR" in l]
    assert len(errors) == 1 and str(db) in errors[0] and "database or disk is full" in errors[0], proc.stderr
    assert "Traceback" not in proc.stderr
    # The BPF load it started beside its imports ended before it did: never a cache entry
    # taken for a bad one at the interpreter's exit (a compile that nothing would use).
    assert "unusable" not in proc.stderr and "BPF program loaded" in proc.stderr, proc.stderr


def test_store_that_fills_mid_run_counts_its_failed_writes_and_otlp_is_unaffected(receiver, start_collector,
                                                                                   targets, tmpfs):
    d = tmpfs("2m")
    collector = start_collector("--exe", "relia_fillst", "--store", str(d / "otel-gpu.db"),
                                OTEL_BSP_MAX_QUEUE_SIZE="65536")  # OTLP must not drop what we count
    target = _target(collector, "relia_fillst", targets)
    sent, t0 = 0, time.monotonic()
    while sent < 400 and time.monotonic() - t0 < 120:  # ~50 KB of spans per request: 2 MiB fills first
        target.get("/work?launches=150")
        sent += 1
        if sent % 10 == 0 and any("not written" in l for l in collector.log.lines):
            break
    # The store writes on its own schedule: the failing write may come after the last request.
    assert wait_until(lambda: any("not written" in l and "database or disk is full" in l
                                  for l in collector.log.lines), 30), \
        f"{sent} requests and the store never failed:\n" + "".join(collector.log.lines[-10:])
    for _ in range(5):  # the collector runs on; the store still fails, OTLP still gets everything
        target.get("/work?launches=7")
    sent += 5
    assert collector.proc.poll() is None
    def work() -> list:  # not the probe request Target.go() made
        return [s for s in server_spans(receiver.spans, target.pid) if s.attributes.get("url.path") == "/work"]
    assert receiver.wait_for(lambda s: len(work()) == sent, 60), (len(work()), sent)
    assert len(_work(receiver, target.pid, 7)) == 5
    assert collector.stop() == 0
    counters = stopped_counters(collector)
    print(sent, "requests;", counters)
    assert counters.get("store_write_failed", 0) > 0, counters
    assert counters.get("spans_dropped_queue_full", 0) == 0 and counters.get("spans_export_failed", 0) == 0
    # rate-limited: one line per 30 s, not one per request
    assert len([l for l in collector.log.lines if "not written" in l]) <= 3
    assert not _tracebacks(collector), _tracebacks(collector)


def _mode(p: Path) -> int:
    return stat.S_IMODE(p.stat().st_mode)


def _store_files(db: Path) -> list:
    return [p for p in (db, Path(f"{db}-wal"), Path(f"{db}-shm")) if p.exists()]


def _report_as_nobody(db: Path, groups: list) -> subprocess.CompletedProcess:
    """`otel-gpu report` as uid/gid nobody with these extra groups. The system Python:
    the venv's interpreter lives under /root (0700); report needs only the stdlib."""
    if not os.access(SYSTEM_PYTHON, os.X_OK):
        pytest.skip(f"{SYSTEM_PYTHON} is needed to run report as another user")
    return subprocess.run([SYSTEM_PYTHON, "-m", "otel_gpu.cli", "report", "--db", str(db), "--format", "json"],
                          capture_output=True, text=True, cwd=ROOT, timeout=60, user=NOBODY, group=NOBODY,
                          extra_groups=groups, env={"PATH": os.environ.get("PATH", ""), "HOME": "/nonexistent",
                                                    "PYTHONPATH": str(ROOT)})


def _served(receiver, collector, targets, name: str) -> None:
    target = _target(collector, name, targets)
    target.get("/work?launches=2")
    assert receiver.wait_for(lambda s: len(_work(receiver, target.pid, 2)) == 1, 20)


def test_store_is_private_by_default(receiver, start_collector, targets, tmpfs):
    db = tmpfs("16m") / "store" / "otel-gpu.db"  # the directory is the collector's to create
    collector = start_collector("--exe", "relia_mode", "--store", str(db))
    _served(receiver, collector, targets, "relia_mode")
    assert _mode(db.parent) == 0o700
    files = _store_files(db)
    assert len(files) == 3 and {_mode(p) for p in files} == {0o600}, [(p.name, oct(_mode(p))) for p in files]
    denied = _report_as_nobody(db, [])
    assert denied.returncode != 0 and "/work" not in denied.stdout, denied.stdout
    assert collector.stop() == 0
    assert _mode(db) == 0o600


def test_store_group_may_read_it_with_report(receiver, start_collector, targets, tmpfs):
    db = tmpfs("16m") / "store" / "otel-gpu.db"
    collector = start_collector("--exe", "relia_group", "--store", str(db), "--store-group", str(READERS_GID))
    _served(receiver, collector, targets, "relia_group")
    assert _mode(db.parent) == 0o750 and db.parent.stat().st_gid == READERS_GID
    files = _store_files(db)
    assert len(files) == 3, files
    for p in files:
        assert (_mode(p), p.stat().st_gid) == (0o640, READERS_GID), (p.name, oct(_mode(p)), p.stat().st_gid)

    def features(proc) -> set:
        assert proc.returncode == 0, proc.stderr
        return {row["feature"] for row in json.loads(proc.stdout)["rows"]}
    assert "/work" in features(_report_as_nobody(db, [READERS_GID]))  # while the collector writes
    assert _report_as_nobody(db, []).returncode != 0                 # others still cannot
    assert collector.stop() == 0
    assert "/work" in features(_report_as_nobody(db, [READERS_GID]))  # and after it stopped


# --- Prometheus ----------------------------------------------------------------------

def _listening(port: int) -> set:
    """Local addresses with a TCP socket listening on `port` (this network namespace)."""
    out = set()
    for name, width in (("/proc/net/tcp", 8), ("/proc/net/tcp6", 32)):
        for line in Path(name).read_text().splitlines()[1:]:
            local, st = line.split()[1], line.split()[3]
            addr, p = local.rsplit(":", 1)
            if st == "0A" and int(p, 16) == port:
                out.add(socket.inet_ntop(socket.AF_INET if width == 8 else socket.AF_INET6,
                                         bytes.fromhex(addr)[::-1] if width == 8 else
                                         b"".join(bytes.fromhex(addr[i:i + 8])[::-1] for i in range(0, 32, 8))))
    return out


@pytest.mark.parametrize("args, bound", [([], {"127.0.0.1"}), (["--prometheus-addr", "0.0.0.0"], {"0.0.0.0"})])
def test_prometheus_listens_on_localhost_unless_told_otherwise(args, bound, start_collector):
    port = free_port()
    start_collector("--exe", "relia_prom_none", "--prometheus-port", str(port), *args)
    assert _listening(port) == bound
    text = urllib.request.urlopen(f"http://127.0.0.1:{port}/metrics", timeout=5).read().decode()
    assert "otel_gpu" in text
