"""What a user of `otel-gpu traces` / `report` sees of NCCL calls and CUDA graph launches:
spans built by the real span builder, written by the real store, read by the commands."""
import json

import pytest

from otel_gpu.store.exporter import StoreExporter
from otel_gpu.store.html_report import _per_route, _waterfall_rows, build_page
from otel_gpu.store.report import build_report
from otel_gpu.store.report_text import to_text
from otel_gpu.store.traces import trace_spans
from nccl_graph_records import PID, TID, request_spans
from store_helpers import MS, T0, request, run_cli

NCCL_BYTES = (1 << 20) + 4096 + 512
TRACE = f"{1:032x}"


@pytest.fixture
def filled(db, clock):
    """Two /train requests with NCCL calls and a graph launch, one plain /infer request."""
    s = StoreExporter(db, now_ns=clock)
    s.export(request_spans(1, T0))
    s.export(request_spans(2, T0 + 10 * MS))
    s.export(request(3, T0 + 20 * MS, MS, service="trainer", route="/infer", copies=((4096, "h2d"),)))
    s.shutdown()
    return db


def test_traces_tree_shows_nccl_children_and_the_graphs_kernels(filled):
    code, out = run_cli("traces", "--db", filled, "--trace-id", TRACE)
    assert code == 0
    lines = {line.split("─ ", 1)[-1].split("  ", 1)[0]: line for line in out.splitlines()}
    allreduce, send, bcast = lines["ncclAllReduce"], lines["ncclSend"], lines["ncclBroadcast"]
    assert "nccl.op=all_reduce" in allreduce and f"nccl.bytes={1 << 20}" in allreduce
    assert "nccl.datatype=float32" in allreduce and "nccl.comm.nranks=4" in allreduce and "nccl.comm.rank=1" in allreduce
    assert "nccl.peer=2" in send and "nccl.root=0" in bcast and "nccl.datatype=bfloat16" in bcast
    assert "graph.kernels=[gemm x3, relu x1]" in lines["cudaGraphLaunch"]
    assert "graph.kernel_nodes=4" in lines["cudaGraphLaunch"]
    server = next(line for line in out.splitlines() if line.startswith("POST /train/{id}"))
    assert "nccl.calls=3" in server and f"nccl.total_bytes={NCCL_BYTES}" in server


def test_perfetto_slices_name_and_carry_nccl_and_graph_contents(filled):
    code, out = run_cli("traces", "--db", filled, "--format", "perfetto", "--trace-id", TRACE)
    assert code == 0
    calls = {e["args"]["gpu.cuda.call"]: e for e in json.loads(out)["traceEvents"]
             if e["ph"] == "X" and e["cat"] == "cuda"}
    ar = calls["ncclAllReduce"]
    assert ar["name"] == f"ncclAllReduce {1 << 20} B" and ar["tid"] == TID and ar["pid"] == PID
    assert (ar["args"]["gpu.nccl.op"], ar["args"]["gpu.nccl.comm.nranks"], ar["args"]["gpu.nccl.comm.rank"],
            ar["args"]["gpu.nccl.datatype"]) == ("all_reduce", 4, 1, "float32")
    assert calls["ncclSend"]["args"]["gpu.nccl.peer"] == 2 and calls["ncclBroadcast"]["args"]["gpu.nccl.root"] == 0
    g = calls["cudaGraphLaunch"]
    assert g["name"] == "cudaGraphLaunch [gemm x3, relu x1]"
    assert g["args"]["gpu.graph.kernel_counts"] == [3, 1] and g["args"]["gpu.graph.kernel_nodes"] == 4
    assert g["args"]["gpu.graph.kernels"][0].startswith("gemm(")


def test_report_has_nccl_bytes_and_calls_per_route(filled, reader):
    rep = build_report(reader())
    rows = {r["feature"]: r for r in rep["rows"]}
    assert (rows["/train/{id}"]["nccl_calls"], rows["/train/{id}"]["nccl_bytes"]) == (6, 2 * NCCL_BYTES)
    assert (rows["/infer"]["nccl_calls"], rows["/infer"]["nccl_bytes"]) == (0, 0)
    assert (rep["totals"]["nccl_calls"], rep["totals"]["nccl_bytes"]) == (6, 2 * NCCL_BYTES)
    code, out = run_cli("report", "--db", filled, "--format", "json")
    doc = json.loads(out)
    assert code == 0 and doc["totals"]["nccl_calls"] == 6
    assert {r["feature"]: r["nccl_bytes"] for r in doc["rows"]} == {"/train/{id}": 2 * NCCL_BYTES, "/infer": 0}
    # The NCCL column, after COPY, on a terminal wide enough for the names beside it
    lines = to_text(rep, width=100).splitlines()
    head = next(line for line in lines if "FEATURE" in line)
    cells = {line.split()[0]: line.split() for line in lines if line.startswith(("/train", "/infer"))}
    heads = head.replace("P50 ms", "P50").replace("P95 ms", "P95").replace("GPU s", "GPU").replace(
        "SPLIT s", "SPLIT").split()
    col = heads.index("NCCL")
    assert heads[col - 1] == "COPY" and cells["/train/{id}"][col] == "2.0M" and cells["/infer"][col] == "0B"


def test_the_nccl_column_goes_first_when_names_need_the_room(filled, reader):
    text = to_text(build_report(reader()), width=80)
    assert "NCCL" not in text.splitlines()[2] and "COPY" in text.splitlines()[2]  # "/train/{id}" needs 11 of the 80 columns


def test_report_text_has_no_nccl_column_without_nccl(db, clock, reader):
    s = StoreExporter(db, now_ns=clock)
    s.export(request(1, T0, MS))
    s.shutdown()
    assert "NCCL" not in to_text(build_report(reader()))


def test_html_per_route_chart_and_waterfall_show_nccl_and_graphs(filled, reader, tmp_path):
    conn = reader()
    fig = _per_route(build_report(conn), many=False)
    assert [t for t in fig.layout.annotations if t.text == "NCCL bytes (calls)"]
    bars = dict(zip(fig.data[2].y, fig.data[2].x))
    assert bars == {"/train/{id}": 2 * NCCL_BYTES, "/infer": 0}
    texts = [r["text"] for r in _waterfall_rows(trace_spans(conn, TRACE), [])]
    assert "ncclAllReduce  all_reduce 1.0M rank 1/4" in texts
    assert "cudaGraphLaunch  gemm x3, relu x1" in texts
    page = build_page(conn, trace_id=TRACE)
    assert "NCCL bytes and calls" in page
