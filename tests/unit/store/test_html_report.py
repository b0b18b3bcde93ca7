"""`otel-gpu report --html`: the series behind the charts add up to the report's rows, the
page needs no network, store text is escaped, and the CLI's flags and errors."""
import re

import pytest

from otel_gpu import semconv as sc
from otel_gpu.store.html_report import build_page
from otel_gpu.store.report import build_report
from otel_gpu.store.series import cost_series
from store_helpers import MS, T0, request, run_cli, window
from tests.browser.demo_store import build_demo_store

S = 10**9


@pytest.fixture(scope="module")
def demo(tmp_path_factory):
    db = str(tmp_path_factory.mktemp("demo") / "otel-gpu.db")
    return db, build_demo_store(db)


def test_series_add_up_to_the_report_rows(demo):
    db, _ = demo
    from otel_gpu.store.schema import open_reader
    conn = open_reader(db)
    series, report = cost_series(conn), build_report(conn)
    assert series["step_s"] == 10 and len(series["starts"]) == 60  # 10 minutes in 10 s bars
    assert set(series["series"]) == {(r["service"], r["feature"]) for r in report["rows"] if r["gpu_seconds"] or r["requests"]}
    for r in report["rows"]:
        s = series["series"].get((r["service"], r["feature"]))
        if s:
            assert sum(s["gpu_seconds"]) == pytest.approx(r["gpu_seconds"], rel=1e-9)
            assert sum(s["cost"]) == pytest.approx(r["cost"], rel=1e-9)
    since = series["starts"][30]
    later = cost_series(conn, since_ns=since)
    assert later["starts"][0] >= since - 10 * S and sum(
        sum(s["gpu_seconds"]) for s in later["series"].values()) < sum(
        sum(s["gpu_seconds"]) for s in series["series"].values())
    conn.close()


def test_page_is_self_contained_with_routes_and_waterfall(demo, tmp_path):
    db, info = demo
    page = tmp_path / "r.html"
    code, out = run_cli("report", "--db", db, "--html", str(page))
    assert code == 0 and "TOTAL" in out  # the text table still goes to stdout
    text = page.read_text()
    assert not re.search(r"<(script|link|img|iframe)[^>]+(src|href)=\"?(https?:)?//", text)  # nothing fetched
    assert text.count("<script") >= 4 and len(text) > 3_000_000  # plotly.js inlined once, then 4 figures
    for route in ("/infer/{id}", "/v1/generate", "/embed"):
        assert route.replace("/", "\\u002f") in text  # in the charts' data (plotly's JSON escapes "/")
    assert info["slowest"]["trace_id"] in text and "matmul_tile" in text and "128x128x1" in text
    for attribution in ("thread", "process", "ambiguous", "window"):
        assert f'"name":"{attribution}"' in text.replace(" ", "")  # a legend entry per attribution outcome


def test_trace_flag_picks_the_waterfall(demo, tmp_path, capsys):
    db, info = demo
    other = next(r for r in info["requests"] if r["route"] == "/embed")
    page = tmp_path / "r.html"
    assert run_cli("report", "--db", db, "--html", str(page), "--trace", other["trace_id"][:16])[0] == 0
    text = page.read_text()
    assert f"Trace <code>{other['trace_id']}</code>: POST /embed" in text and "embedding_gather" in text
    assert run_cli("report", "--db", db, "--html", str(page), "--trace", "0000")[0] == 1
    assert "no trace 0000" in capsys.readouterr().err
    assert run_cli("report", "--db", db, "--html", str(page), "--trace", "xyz")[0] == 2
    assert run_cli("report", "--db", db, "--html", str(tmp_path / "no" / "r.html"))[0] == 1


def test_store_text_is_escaped(store, reader):
    hostile = "/x/<img src=x onerror=alert(1)>"
    store.export(request(0xBAD << 100, T0, 3 * MS, route=hostile, gpu_seconds=0.001, cost=1e-6))
    store.export(window(0xBEE << 100, T0 + S, gpu_seconds=0.0005, cost=5e-7))
    text = build_page(reader())
    assert "<img src=x" not in text and "&lt;img src=x onerror=alert(1)&gt;" in text


def test_empty_store(store, reader):
    text = build_page(reader())
    assert 'id=empty' in text and "<script" not in text


def test_the_time_split_per_route_and_for_the_slowest(store, reader):
    split = {sc.GPU_TIME_ON_CPU: 0.004, sc.GPU_TIME_CPU_WAIT: 0.001, sc.GPU_TIME_GPU_SYNC: 0.040,
             sc.GPU_TIME_BLOCKED: 0.002}
    store.export(request(1, T0, 47 * MS, route="/gemm", server_extra=split))
    store.export(request(2, T0 + S, 60 * MS, route="/gemm", server_extra={**split, sc.GPU_TIME_SHARED: True}))
    store.export(request(3, T0 + 2 * S, 3 * MS, route="/health"))  # not split
    text = build_page(reader())
    assert "<table id=time-split>" in text and "Where the time went" in text
    table = text[text.index("<table id=time-split>"):]
    assert "<td class=num>40.0</td>" in table[:table.index("</table>")]  # GPU sync, the mean of both
    slowest = text[text.index("<table id=slowest>"):]
    slowest = slowest[:slowest.index("</table>")]
    assert "<td class=num>40.0*</td>" in slowest and "<td class=num>40.0</td>" in slowest  # * : shared
    assert slowest.count("<td class=num>-</td>") == 4  # the request not split
