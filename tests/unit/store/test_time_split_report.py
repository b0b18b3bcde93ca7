"""The time split in the store and in `otel-gpu report`: each request's parts kept (NULL
when not split), and per feature the mean of its split requests, with how many of them
were shared."""
import sqlite3

from otel_gpu import semconv as sc
from otel_gpu.store.report import build_report
from otel_gpu.store.report_text import to_text
from store_helpers import MS, T0, request


def split(on_cpu, cpu_wait, gpu_sync, blocked, shared=False) -> dict:
    attrs = {sc.GPU_TIME_ON_CPU: on_cpu, sc.GPU_TIME_CPU_WAIT: cpu_wait, sc.GPU_TIME_GPU_SYNC: gpu_sync,
             sc.GPU_TIME_BLOCKED: blocked}
    return {**attrs, sc.GPU_TIME_SHARED: True} if shared else attrs


def test_each_request_is_kept_and_each_feature_averaged(store, reader):
    store.export(request(1, T0, 50 * MS, route="/gemm", server_extra=split(0.01, 0.0, 0.038, 0.002)))
    store.export(request(2, T0 + 1, 70 * MS, route="/gemm", server_extra=split(0.03, 0.0, 0.038, 0.002, True)))
    store.export(request(3, T0 + 2, 40 * MS, route="/tokenize", server_extra=split(0.036, 0.004, 0.0, 0.0)))
    store.export(request(4, T0 + 3, 40 * MS, route="/tokenize"))  # not split: not averaged
    conn = reader()
    conn.row_factory = sqlite3.Row
    rows = {r["trace_id"]: dict(r) for r in conn.execute("SELECT * FROM requests")}
    assert (rows[f"{2:032x}"]["on_cpu"], rows[f"{2:032x}"]["time_shared"]) == (0.03, 1)
    assert rows[f"{4:032x}"]["on_cpu"] is None and rows[f"{4:032x}"]["time_shared"] == 0
    report = build_report(conn)
    by_feature = {t["feature"]: t for t in report["time_split"]}
    assert by_feature["/gemm"]["requests"] == 2 and by_feature["/gemm"]["shared"] == 1
    assert round(by_feature["/gemm"]["on_cpu_ms"], 6) == 20.0 and round(by_feature["/gemm"]["gpu_sync_ms"], 6) == 38.0
    assert by_feature["/tokenize"]["requests"] == 1 and round(by_feature["/tokenize"]["cpu_wait_ms"], 6) == 4.0
    assert [t["feature"] for t in report["time_split"]] == ["/gemm", "/tokenize"]  # most time first
    text = to_text(report)
    assert "where the time went" in text and "(1 shared)" in text
