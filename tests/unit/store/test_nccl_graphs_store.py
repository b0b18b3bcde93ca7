"""NCCL calls and CUDA graph launches in the local store: their spans keep every
attribute, the request row their counts (schema v3), and a v2 store upgrades in place."""
import json
import sqlite3
from pathlib import Path

import pytest

from otel_gpu import semconv as sc
from otel_gpu.store.exporter import StoreExporter
from otel_gpu.store.report import build_report
from otel_gpu.store.schema import SCHEMA_VERSION, columns
from otel_gpu.store.traces import trace_spans
from nccl_graph_records import GEMM, RELU, request_spans
from store_helpers import T0

V2_DUMP = Path(__file__).with_name("data") / "store_v2.sql"


def _children(spans, call):
    return [s for s in spans if (s.attributes or {}).get(sc.GPU_CUDA_CALL) == call]


def test_request_row_counts_nccl_calls_bytes_and_graph_kernels(store, reader):
    store.export(request_spans(1, T0))
    row = reader().execute("SELECT launches, nccl_calls, nccl_bytes, graph_kernels FROM requests").fetchone()
    assert row == (1, 3, (1 << 20) + 4096 + 512, 4)  # the graph launch is 1 launch running 4 kernels


def test_a_request_without_nccl_or_graphs_reads_zero(store, reader):
    from nccl_graph_records import PID, TID
    from tests.unit.pipeline.calls import cuda
    store.export(request_spans(1, T0, calls=[cuda(pid=PID, tid=TID, ts=1100)]))
    assert reader().execute("SELECT nccl_calls, nccl_bytes, graph_kernels FROM requests").fetchone() == (0, 0, 0)


def test_nccl_and_graph_spans_come_back_with_their_attributes(store, reader):
    store.export(request_spans(1, T0))
    spans = trace_spans(reader(), f"{1:032x}")
    (allreduce,), (send,), (bcast,) = (_children(spans, c) for c in ("ncclAllReduce", "ncclSend", "ncclBroadcast"))
    a = allreduce.attributes
    assert (a[sc.GPU_NCCL_OP], a[sc.GPU_NCCL_BYTES], a[sc.GPU_NCCL_DATATYPE], a[sc.GPU_NCCL_REDUCTION],
            a[sc.GPU_NCCL_COMM_NRANKS], a[sc.GPU_NCCL_COMM_RANK]) == ("all_reduce", 1 << 20, "float32", "sum", 4, 1)
    assert send.attributes[sc.GPU_NCCL_PEER] == 2 and sc.GPU_NCCL_ROOT not in send.attributes
    assert bcast.attributes[sc.GPU_NCCL_ROOT] == 0 and bcast.attributes[sc.GPU_NCCL_DATATYPE] == "bfloat16"
    (graph,) = _children(spans, "cudaGraphLaunch")
    g = graph.attributes
    assert list(g[sc.GPU_GRAPH_KERNELS]) == [GEMM, RELU] and list(g[sc.GPU_GRAPH_KERNEL_COUNTS]) == [3, 1]
    assert g[sc.GPU_GRAPH_KERNEL_NODES] == 4


def _v2_store(db):
    Path(db).parent.mkdir(parents=True, exist_ok=True)
    with sqlite3.connect(db) as c:
        c.executescript(V2_DUMP.read_text())


def test_a_v2_store_is_read_as_it_is_then_upgraded_by_the_writer(db, clock, reader):
    """data/store_v2.sql: a store the v2 StoreExporter wrote, dumped. A reader reads it
    without the v3 columns (NCCL 0); a collector adds them, keeping the old rows."""
    _v2_store(db)
    old = reader()
    assert old.execute("PRAGMA user_version").fetchone()[0] == 2 and "nccl_calls" not in columns(old, "requests")
    (row,) = build_report(old)["rows"][:1]
    assert (row["feature"], row["copy_bytes"], row["nccl_calls"], row["nccl_bytes"]) == ("/old", 2048, 0, 0)
    s = StoreExporter(db, now_ns=clock)
    s.export(request_spans(1, T0 + 5))
    s.shutdown()
    conn = reader()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == SCHEMA_VERSION == 6
    assert conn.execute("SELECT feature, nccl_calls, nccl_bytes, graph_kernels FROM requests ORDER BY ts").fetchall() \
        == [("/old", 0, 0, 0), ("/train/{id}", 3, (1 << 20) + 4096 + 512, 4)]
    rep = build_report(conn)
    assert rep["totals"]["nccl_calls"] == 3 and rep["totals"]["gpu_seconds"] == pytest.approx(0.5 + 0.2)
    assert {json.loads(a).get(sc.GPU_CUDA_CALL) for (a,) in conn.execute("SELECT attributes FROM spans")} >= {
        "ncclAllReduce", "cudaGraphLaunch"}


def test_reopening_a_current_store_adds_nothing_twice(db, clock, reader):
    StoreExporter(db, now_ns=clock).shutdown()
    StoreExporter(db, now_ns=clock).shutdown()
    cols = [r[1] for r in reader().execute("PRAGMA table_info(requests)")]
    assert cols.count("nccl_calls") == 1 and cols[-9:] == ["nccl_calls", "nccl_bytes", "graph_kernels", "chunks",
                                                          "on_cpu", "cpu_wait", "gpu_sync", "blocked", "time_shared"]


def test_a_v3_store_gets_chunks_and_the_report_gives_cost_per_chunk(db, clock, reader):
    """A v3 store (no chunks column) gets it on open, its rows reading 0; a streaming
    feature's cost per chunk counts its shares under another service (a batching engine)."""
    StoreExporter(db, now_ns=clock).shutdown()
    conn = sqlite3.connect(db)
    conn.execute("ALTER TABLE requests DROP COLUMN chunks")
    conn.execute("PRAGMA user_version = 3")
    conn.commit()
    conn.close()
    s = StoreExporter(db, now_ns=clock)
    s.export(request_spans(1, T0 + 5))
    s.shutdown()
    conn = reader()
    assert conn.execute("PRAGMA user_version").fetchone()[0] == 6 and "chunks" in columns(conn, "requests")
    conn.close()
    w = sqlite3.connect(db)
    w.execute("UPDATE requests SET chunks = 40, feature = '/stream'")
    w.execute("INSERT INTO window_costs (ts, trace_id, span_id, service, pid, kind, feature, request_trace_id,"
              " request_span_id, gpu_seconds, cost, currency) VALUES (?, 'a', 'b', 'engine', 9, 'split', '/stream',"
              " 'c', 'd', 0.3, 0.03, 'USD')", (T0 + 6,))
    w.commit()
    w.close()
    conn = reader()
    (own,) = conn.execute("SELECT SUM(gpu_seconds) FROM requests").fetchone()
    (c,) = build_report(conn)["per_chunk"]
    assert c["feature"] == "/stream" and c["chunks"] == 40
    assert c["gpu_seconds_per_chunk"] == pytest.approx((own + 0.3) / 40)
