"""build_destinations from Config; Destinations fan-out; the export/ and store/
packages independent of each other; no private SDK fields read."""
from __future__ import annotations

import ast
import io
from pathlib import Path

import pytest
from opentelemetry.exporter.otlp.proto.grpc.trace_exporter import OTLPSpanExporter as GrpcExporter
from opentelemetry.exporter.otlp.proto.http.trace_exporter import OTLPSpanExporter as HttpExporter
from opentelemetry.sdk.resources import Resource
from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult
from opentelemetry.trace import SpanContext, SpanKind, TraceFlags

import otel_gpu
from otel_gpu import semconv as sc
from otel_gpu.clock import BpfClock
from otel_gpu.config import Config
from otel_gpu.wiring import build_destinations
from otel_gpu.export.console import ConsoleTreeExporter
from otel_gpu.export.destinations import Destinations, QueuedExporter
from otel_gpu.export.spans import SpanBuilder
from otel_gpu.export.stage import ExportStage
from otel_gpu.ratelimit import Stats
from otel_gpu.records import Tick
from otel_gpu.store.exporter import StoreExporter
from otel_gpu.store.schema import open_reader

PKG = Path(otel_gpu.__file__).parent


def record() -> list[ReadableSpan]:
    ctx = SpanContext(0xAB, 1, False, TraceFlags(TraceFlags.SAMPLED))
    res = Resource({sc.SERVICE_NAME: "demo"})
    server = ReadableSpan(name="GET /x", context=ctx, resource=res, kind=SpanKind.SERVER,
                          attributes={sc.HTTP_REQUEST_METHOD: "GET", sc.HTTP_ROUTE: "/x", sc.GPU_LAUNCHES: 1},
                          start_time=1_000, end_time=2_000)
    kid = ReadableSpan(name="cudaLaunchKernel", context=SpanContext(0xAB, 2, False, TraceFlags(TraceFlags.SAMPLED)),
                       parent=ctx, resource=res, kind=SpanKind.INTERNAL, start_time=1_100, end_time=1_200)
    return [server, kid]


@pytest.fixture
def built():
    made = []

    def build(**fields) -> Destinations:
        made.append(build_destinations(Config(**fields), Stats(), out=io.StringIO()))
        return made[-1]
    yield build
    for d in made:
        d.shutdown()


def _kinds(d: Destinations) -> list:
    return [type(e) for _, e in d.exporters]


def test_console_only(built):
    d = built(console=True)
    assert d.names == ["console"] and _kinds(d) == [ConsoleTreeExporter]
    d.export(record())
    assert "GET /x" in d.exporters[0][1].out.getvalue() and d.spans_out == 2


def test_store_only(built, tmp_path):
    db = str(tmp_path / "s.db")
    d = built(store_path=db)
    assert d.names == ["store"] and _kinds(d) == [StoreExporter]
    d.export(record())
    d.shutdown()
    conn = open_reader(db)
    assert conn.execute("SELECT route, launches FROM requests").fetchone() == ("/x", 1)
    conn.close()


@pytest.mark.parametrize("protocol, cls", [("grpc", GrpcExporter), ("http/protobuf", HttpExporter)])
def test_otlp_exporter_follows_the_protocol(built, protocol, cls):
    d = built(otlp_traces=True, otlp_protocol=protocol, queue_size=100, export_batch_size=512)
    assert d.names == ["otlp"] and _kinds(d) == [QueuedExporter]
    q = d.exporters[0][1]
    assert isinstance(q.inner, cls) and q.queue_size == 100


def test_all_three_in_order(built, tmp_path):
    d = built(console=True, store_path=str(tmp_path / "s.db"), otlp_traces=True)
    assert d.names == ["console", "store", "otlp"]


def test_nothing_configured_is_an_empty_list(built):
    d = built()
    assert d.names == []
    d.export(record())  # counted, goes nowhere
    assert d.spans_out == 2


def test_bad_protocol_fails_before_the_store_is_made(tmp_path):
    db = tmp_path / "s.db"
    with pytest.raises(ValueError, match="protocol"):
        build_destinations(Config(store_path=str(db), otlp_traces=True, otlp_protocol="udp"), Stats())
    assert not db.exists()


class Recording(SpanExporter):
    def __init__(self, fail: bool = False) -> None:
        self.fail, self.got, self.closed = fail, [], False

    def export(self, spans):
        if self.fail:
            raise OSError("disk full")
        self.got.append(list(spans))
        return SpanExportResult.SUCCESS

    def shutdown(self):
        self.closed = True


def test_each_destination_gets_the_whole_record_and_a_failure_stays_local():
    broken, ok = Recording(fail=True), Recording()
    stats = Stats()
    d = Destinations([("store", broken), ("console", ok)], stats)
    spans = record()
    d.export(spans)
    d.export([])  # nothing: not a call
    assert ok.got == [spans] and stats.snapshot() == {"store_export_errors": 1}
    d.shutdown()
    assert broken.closed and ok.closed


def _imports(path: Path) -> set[str]:
    """Absolute module names imported by one file (relative ones resolved)."""
    pkg = ("otel_gpu",) + path.relative_to(PKG).parent.parts
    names = set()
    for node in ast.walk(ast.parse(path.read_text())):
        if isinstance(node, ast.Import):
            names |= {a.name for a in node.names}
        elif isinstance(node, ast.ImportFrom):
            base = list(pkg[:len(pkg) - node.level + 1]) if node.level else []
            mod = ".".join(base + ([node.module] if node.module else []))
            names |= {mod} | {f"{mod}.{a.name}" for a in node.names}
    return names


@pytest.mark.parametrize("package, other", [("store", "export"), ("export", "store")])
def test_store_and_export_do_not_import_each_other(package, other):
    for f in (PKG / package).glob("*.py"):
        bad = {m for m in _imports(f) if m.startswith(f"otel_gpu.{other}")}
        assert not bad, f"{f.name} imports {bad}"


def test_no_private_sdk_fields_are_read():
    for f in PKG.rglob("*.py"):
        text = f.read_text()
        assert "_batch_processor" not in text and "._queue" not in text, f


class Batching(Recording):
    def __init__(self, fail: bool = False) -> None:
        super().__init__()
        self.calls: list[str] = []
        self.fail_batch = fail

    def begin_batch(self):
        self.calls.append("begin")

    def end_batch(self):
        if self.fail_batch:
            raise OSError("disk full")
        self.calls.append("end")


def test_a_batch_reaches_the_destinations_that_write_in_batches_and_a_failure_stays_local():
    broken, ok, plain = Batching(fail=True), Batching(), Recording()
    stats = Stats()
    d = Destinations([("store", broken), ("other", ok), ("console", plain)], stats)
    d.begin_batch()
    d.export(record())
    d.end_batch()
    assert ok.calls == ["begin", "end"] and broken.calls == ["begin"] and len(plain.got) == 1
    assert stats.snapshot() == {"store_export_errors": 1}


def test_the_export_stage_brackets_each_batch():
    rec = Batching()
    stage = ExportStage(SpanBuilder(BpfClock()), Destinations([("store", rec)], Stats()))
    stage.process([Tick(1)])
    stage.process([])
    assert rec.calls == ["begin", "end", "begin", "end"]
