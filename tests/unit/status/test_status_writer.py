"""The collector's state file: atomic, world-readable, rewritten each interval, never
raising into the collector; export health and request rate from counter movements."""
from __future__ import annotations

import json
import os
import stat
from types import SimpleNamespace

from otel_gpu import __version__
from otel_gpu.export.console import ConsoleTreeExporter
from otel_gpu.export.destinations import Destinations
from otel_gpu.ratelimit import Stats
from otel_gpu.status.file import default_status_path, read_state, write_atomic
from otel_gpu.status.writer import ExportHealth, RequestRate, StatusWriter, destination_counts
from otel_gpu.store.exporter import StoreExporter


class FakeCollector:
    """Named fake: a real Collector needs root and a loaded BPF program. It has the
    attributes StatusWriter reads, with real Stats and real Destinations."""

    def __init__(self, stats: Stats, destinations: Destinations, processes: dict) -> None:
        self.program = None  # probes: covered by the bpf-tier test
        self._processes = processes
        self.wiring = SimpleNamespace(destinations=destinations,
                                      stitcher=SimpleNamespace(attributed={"thread": 3, "ambiguous": 1},
                                                                by_rule={"thread.one": 3, "process.several": 1,
                                                                         "unit.bound": 0}))

    def traced_processes(self) -> dict:
        return self._processes


class Clock:
    def __init__(self, t: float) -> None:
        self.t = t

    def __call__(self) -> float:
        return self.t


def test_default_path_from_environment():
    assert default_status_path({}) == "/run/otel-gpu/status.json"
    assert default_status_path({"OTEL_GPU_STATUS_FILE": "/tmp/s.json"}) == "/tmp/s.json"


def test_write_atomic_sets_modes_whatever_the_umask(tmp_path):
    path = tmp_path / "run" / "otel-gpu" / "status.json"
    old = os.umask(0o077)
    try:
        write_atomic(str(path), {"pid": 1, "written_at": 2.0})
    finally:
        os.umask(old)
    assert stat.S_IMODE(path.stat().st_mode) == 0o644
    assert stat.S_IMODE(path.parent.stat().st_mode) == 0o755
    assert read_state(str(path)) == {"pid": 1, "written_at": 2.0}
    assert os.listdir(path.parent) == ["status.json"]  # no temporary file left


def test_the_final_state_is_kept_marked_stopped_unless_another_collector_wrote_since(tmp_path):
    path = tmp_path / "status.json"
    stats = Stats()
    dests = Destinations([("console", ConsoleTreeExporter(open(os.devnull, "w")))], stats)
    collector = FakeCollector(stats, dests, {})
    wall, mono = Clock(1000.0), Clock(50.0)
    w = StatusWriter(str(path), stats, interval_s=2.0, clock=wall, monotonic=mono)
    w.tick(collector)
    stats.add("requests_finished", 4)
    stats.add("lost_events", 2)
    wall.t = 1000.5  # within the interval: the final write does not wait for it
    w.final(collector)
    s = read_state(str(path))
    assert s["stopped_at"] == 1000.5 and s["requests"]["finished"] == 4 and s["counters"]["lost_events"] == 2
    assert s["spans"] == dests.spans_out and s["attribution"] == {"thread": 3, "ambiguous": 1}
    write_atomic(str(path), {"pid": w.pid + 1, "written_at": 1001.0})  # a new collector runs
    w.final(collector)
    assert read_state(str(path)) == {"pid": w.pid + 1, "written_at": 1001.0}


def test_export_health_failing_since_and_recovery():
    h = ExportHealth()
    assert h.update("otlp", {"spans_exported": 0, "spans_failed": 0}, 10.0)["state"] == "idle"
    assert h.update("otlp", {"spans_exported": 5, "spans_failed": 0}, 12.0)["state"] == "ok"
    assert h.update("store", {"spans_exported": 0, "requests_summed": 4}, 12.0)["state"] == "ok"
    e = h.update("otlp", {"spans_exported": 5, "spans_failed": 3}, 14.0)
    assert (e["state"], e["failing_since"]) == ("failing", 14.0)
    e = h.update("otlp", {"spans_exported": 5, "spans_failed": 9}, 16.0)
    assert (e["state"], e["failing_since"]) == ("failing", 14.0)  # since the first failing write
    e = h.update("otlp", {"spans_exported": 5, "spans_failed": 9}, 18.0)
    assert e["state"] == "failing"  # nothing moved: no news is not recovery
    e = h.update("otlp", {"spans_exported": 6, "spans_failed": 9}, 20.0)
    assert (e["state"], e["failing_since"]) == ("ok", None)
    assert h.update("store", {"spans_exported": 0, "write_errors": 1}, 20.0)["state"] == "failing"


def test_request_rate_over_the_last_interval():
    r = RequestRate()
    assert r.update(100, 10.0) == 0.0  # no interval yet
    assert r.update(110, 12.0) == 5.0
    assert r.update(110, 14.0) == 0.0


def test_destination_counts_per_kind(tmp_path):
    stats = {"spans_exported": 7, "spans_export_failed": 2, "spans_dropped_queue_full": 1, "console_export_errors": 4}
    store = StoreExporter(str(tmp_path / "s.db"))
    try:
        assert destination_counts("store", store, stats, 50) == {"spans_exported": 0, "requests_summed": 0,
                                                                 "write_errors": 0}
    finally:
        store.shutdown()
    assert destination_counts("console", ConsoleTreeExporter(open(os.devnull, "w")), stats, 50) == \
        {"spans_exported": 50, "write_errors": 4}
    otlp = SimpleNamespace(pending=3)  # QueuedExporter's one property read here
    assert destination_counts("otlp", otlp, stats, 50) == {"spans_exported": 7, "spans_failed": 3, "pending": 3}


def test_writer_state_and_cadence(tmp_path):
    path = tmp_path / "status.json"
    stats = Stats()
    dests = Destinations([("console", ConsoleTreeExporter(open(os.devnull, "w")))], stats)
    collector = FakeCollector(stats, dests, {os.getpid(): "cuda", 999999999: "http-server"})
    wall, mono = Clock(1000.0), Clock(50.0)
    w = StatusWriter(str(path), stats, interval_s=2.0, clock=wall, monotonic=mono)
    stats.add("requests_finished", 10)
    w.tick(collector)
    s = json.loads(path.read_text())
    assert (s["pid"], s["version"], s["written_at"], s["requests"]["finished"]) == (os.getpid(), __version__, 1000.0, 10)
    assert s["processes"]["count"] == 2
    assert {p["pid"]: (p["role"], p["name"]) for p in s["processes"]["listed"]}[999999999] == ("http-server", "?")
    assert s["attribution"] == {"thread": 3, "ambiguous": 1}
    assert s["attribution_rules"] == {"thread.one": 3, "process.several": 1}  # the rules that decided some
    assert s["exports"][0]["name"] == "console"
    stats.add("requests_finished", 8)
    wall.t, mono.t = 1001.0, 51.0
    w.tick(collector)  # within the interval: not rewritten
    assert json.loads(path.read_text())["written_at"] == 1000.0
    wall.t, mono.t = 1002.0, 52.0
    stats.add("http_parse_errors", 2)
    w.tick(collector)
    s = json.loads(path.read_text())
    assert s["requests"] == {"finished": 18, "per_second": 4.0}
    assert s["counters"]["http_parse_errors"] == 2 and s["uptime_s"] == 2.0


def test_write_failure_is_counted_not_raised(tmp_path):
    blocker = tmp_path / "file"
    blocker.write_text("")
    stats = Stats()
    collector = FakeCollector(stats, Destinations([], stats), {})
    w = StatusWriter(str(blocker / "status.json"), stats)  # a file where the directory should be
    w.tick(collector)
    assert stats.snapshot()["status_write_errors"] == 1
