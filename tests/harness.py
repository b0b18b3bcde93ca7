"""Shared by the bpf and gpu tiers: the collector run as a real subprocess with the
real OTLP/gRPC exporter, a receiver started here, and target processes."""
from __future__ import annotations

import os
import subprocess
import sys
import time
import urllib.request
from contextlib import contextmanager
from pathlib import Path

import pytest

from bench.isolate import OwnCgroup
from otel_gpu.demo.runner import LineWatcher, free_port, stop_process
from tests.support.otlp_receiver import OtlpReceiver
from tests.support.collector_process import CollectorProcess

ROOT = Path(__file__).resolve().parents[1]
TARGETS = ROOT / "tests" / "bpf" / "targets"


@pytest.fixture
def receiver():
    r = OtlpReceiver().start()
    yield r
    r.stop()


class RunningCollector(CollectorProcess):
    """The collector exporting to `receiver` (tests/support: shared with the bench). Ready
    within 180 s: a BPF compile took 28-70 s at load average 30-45."""

    def __init__(self, receiver: OtlpReceiver, args: list[str], env: dict) -> None:
        self.receiver = receiver
        super().__init__(args, {"OTEL_EXPORTER_OTLP_ENDPOINT": receiver.endpoint, "OTEL_BSP_SCHEDULE_DELAY": "200",
                                **env})


def check_clean(c: CollectorProcess, allowed: tuple = ()) -> None:
    """A stopped collector exited 0 and logged no ERROR (nor a traceback) but the lines
    containing one of `allowed`: what a test provokes on purpose."""
    errors = [line for line in c.errors() if not any(a in line for a in allowed)]
    assert c.proc.returncode == 0 and errors == [], \
        f"collector exited {c.proc.returncode}, errors: {errors}"


@pytest.fixture
def start_collector(receiver):
    """start(*args, allow_errors=(), **env): a collector that, at the test's end, must have
    exited 0 and logged no ERROR but those naming one of `allow_errors` (check_clean)."""
    started = []

    def start(*args: str, allow_errors: tuple = (), **env: str) -> RunningCollector:
        c = RunningCollector(receiver, list(args), env)
        started.append((c, allow_errors))
        return c
    yield start
    for c, _ in started:
        c.stop()
    for c, allowed in started:
        check_clean(c, allowed)


@contextmanager
def module_collector(*args: str, **env: str):
    """A collector with a receiver of its own, for a module-scoped fixture: tests that need
    no fresh collector share one (each start and stop costs seconds: the BPF compile, and
    ~0.1 s per uprobe detached). They filter what they check by their own target's pid."""
    r = OtlpReceiver().start()
    try:
        c = RunningCollector(r, list(args), env)
        try:
            yield c
        finally:
            c.stop()
        check_clean(c)
    finally:
        r.stop()


class Target:
    """A target process started after the collector, held until it is traced."""

    def __init__(self, argv: list[str], env: dict | None = None, beside: "Target | None" = None) -> None:
        # In a cgroup of its own, as a container: else this process, whose OTLP receiver is a
        # gRPC server, is a related server the collector traces (bench/isolate.py).
        # `beside`: in that target's cgroup instead, a process of the same container.
        self.cgroup = beside.cgroup if beside is not None else OwnCgroup()
        self._owns_cgroup = beside is None
        self.proc = subprocess.Popen(self.cgroup.wrap(argv), stdin=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, cwd=ROOT, env=dict(os.environ, **(env or {})))
        self.log = LineWatcher(self.proc.stderr, echo=None)
        if not self.log.wait_for("listening on", 30):
            raise RuntimeError("target did not start:\n" + "".join(self.log.lines))
        line = next(l for l in self.log.lines if "listening on" in l)
        self.port = int(line.split()[2])
        self.pid = self.proc.pid

    def go_raw(self) -> None:
        self.proc.stdin.write("go\n")
        self.proc.stdin.flush()

    def go(self) -> None:
        """Lets an HTTP target serve, and waits until it answers."""
        self.go_raw()
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:  # the server binds before "listening" but serves after go
            try:
                urllib.request.urlopen(f"http://127.0.0.1:{self.port}/nothing", timeout=2)
            except urllib.error.HTTPError:
                return
            except OSError:
                time.sleep(0.1)
        raise RuntimeError("target not serving")

    def get(self, path: str, headers: dict | None = None) -> bytes:
        req = urllib.request.Request(f"http://127.0.0.1:{self.port}{path}", headers=headers or {})
        return urllib.request.urlopen(req, timeout=20).read()

    def stop(self) -> None:
        stop_process(self.proc, timeout=10)
        if self._owns_cgroup:
            self.cgroup.remove()


@pytest.fixture
def start_target():
    started = []

    def start(kind: str = "stdlib", env: dict | None = None) -> Target:
        port = 0 if kind != "asgi" else free_port()
        t = Target([sys.executable, str(TARGETS / "cuda_http.py"), kind, str(port)], env)
        started.append(t)
        return t
    yield start
    for t in started:
        t.stop()


def server_spans(spans, pid: int) -> list:
    return [s for s in spans if s.kind == 2 and s.attributes.get("process.pid") == pid]  # 2 = SERVER


def children_of(spans, parent) -> list:
    return [s for s in spans if s.parent_span_id == parent.span_id and s.trace_id == parent.trace_id]


def mark_tier(items, folder: str, marker, reason: str | None) -> None:
    """Marks the tests under `folder` with their tier, skipped with `reason` if any."""
    for item in items:
        if f"tests/{folder}/" in str(item.fspath):
            item.add_marker(marker)
            if reason:
                item.add_marker(pytest.mark.skip(reason=reason))


def started(start_collector, start_target, *collector_args: str, kind: str = "stdlib",
            env: dict | None = None):
    """A collector, then a target process it traces, serving: (collector, target)."""
    collector = start_collector(*collector_args)
    return collector, traced(collector, start_target, kind, env)


def serve_traced(collector: RunningCollector, target: Target) -> Target:
    """`target`, serving once `collector` traces it; stopped (never left behind) if it is not."""
    try:
        collector.wait_traced(target.pid)
        target.go()
    except BaseException:
        target.stop()
        raise
    return target


def traced(collector: RunningCollector, start_target, kind: str = "stdlib", env: dict | None = None) -> Target:
    """A target process that a running collector traces, serving."""
    target = start_target(kind, env)
    collector.wait_traced(target.pid)
    target.go()
    return target
