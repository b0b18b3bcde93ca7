"""`otel-gpu report --html FILE`: one self-contained page (plotly.js inlined, no network
at view time) from the local store: GPU seconds and cost per route over time, launches
and copied bytes (and NCCL bytes, where any) per route, the slowest requests, and one trace as a waterfall of its
server span and CUDA calls, each coloured by its attribution.

The figures come from the store's queries (report.build_report, series.cost_series,
traces.list_requests, related.traces_with_windows); this file only draws them. Every
text from the store is escaped: plotly reads its labels as HTML-like markup."""
from __future__ import annotations

import html
from datetime import datetime, timezone
from pathlib import Path
from string import Template
from typing import Optional

from opentelemetry.trace import SpanKind

from .. import semconv as sc
from ..span_tree import graph_kernels_text
from .related import traces_with_windows
from .report import TIME_PARTS, build_report
from .report_text import OUTSIDE_LABEL, _bytes, near_mark
from .series import cost_series
from .traces import list_requests, summarised_note

TEMPLATE = Path(__file__).with_name("report_page.html")
MAX_WATERFALL_ROWS = 300  # a request has at most the span budget's calls; windows can add more
# Attribution outcomes (pipeline/model.py ATTRIBUTIONS) and the request itself.
COLORS = {"request": "#334e68", "task": "#2e7d32", "thread": "#1565c0", "process": "#7b1fa2",
          "ambiguous": "#ef6c00", "shared": "#c62828", "outside": "#8d8d8d", "window": "#cfd8dc"}
DEVICE_COLOR = "#00897b"  # the device lane: when the GPU ran a call's work (device-clock mode)
_CONFIG = {"displaylogo": False, "responsive": True}


def _e(text) -> str:
    return html.escape(str(text), quote=True)


def _utc(ns: int) -> str:
    return datetime.fromtimestamp(ns / 1e9, timezone.utc).strftime("%Y-%m-%d %H:%M:%S")


def _label(service: str, feature: Optional[str], many_services: bool) -> str:
    name = feature if feature is not None else OUTSIDE_LABEL
    return _e(f"{service} {name}" if many_services else name)


def _html(fig, first: bool, div_id: str) -> str:
    return fig.to_html(full_html=False, include_plotlyjs=first, config=_CONFIG, div_id=div_id)


def _over_time(series: dict, report: dict, many: bool):
    import plotly.graph_objects as go
    from plotly.colors import qualitative
    from plotly.subplots import make_subplots
    currency = report["currency"] or ""
    fig = make_subplots(rows=2, cols=1, shared_xaxes=True, vertical_spacing=0.08,
                        subplot_titles=("GPU seconds", f"cost {_e(currency)}".strip()))
    x = [_utc(t) for t in series["starts"]]
    order = [(r["service"], r["feature"]) for r in report["rows"] if (r["service"], r["feature"]) in series["series"]]
    for i, key in enumerate(order):
        s = series["series"][key]
        color = qualitative.Plotly[i % len(qualitative.Plotly)]
        name = _label(key[0], key[1], many)
        fig.add_trace(go.Bar(x=x, y=s["gpu_seconds"], name=name, legendgroup=name, marker_color=color), 1, 1)
        fig.add_trace(go.Bar(x=x, y=s["cost"], name=name, legendgroup=name, marker_color=color,
                             showlegend=False), 2, 1)
    fig.update_layout(barmode="stack", height=520, margin=dict(l=60, r=20, t=40, b=40),
                      legend=dict(title=dict(text="route")), bargap=0.1)
    fig.update_xaxes(title_text=f"time (UTC), {series['step_s']} s per bar", row=2, col=1)
    return fig


def _per_route(report: dict, many: bool):
    import plotly.graph_objects as go
    from plotly.subplots import make_subplots
    rows = [r for r in report["rows"] if r["requests"]]
    names = [_label(r["service"], r["feature"], many) for r in rows]
    nccl = report["totals"]["nccl_calls"] > 0  # a third chart only where NCCL was seen
    titles = ("kernel launches", "bytes copied (cudaMemcpy*)") + (("NCCL bytes (calls)",) if nccl else ())
    fig = make_subplots(rows=1, cols=len(titles), horizontal_spacing=0.25 if not nccl else 0.15,
                        subplot_titles=titles)
    launches = [round(r["launches_per_request"] * r["requests"]) for r in rows]
    fig.add_trace(go.Bar(y=names, x=launches, orientation="h", marker_color="#1565c0", showlegend=False,
                         text=[f"{n:,}" for n in launches], textposition="auto"), 1, 1)
    fig.add_trace(go.Bar(y=names, x=[r["copy_bytes"] for r in rows], orientation="h", marker_color="#2e7d32",
                         showlegend=False, text=[_bytes(r["copy_bytes"]) for r in rows], textposition="auto"), 1, 2)
    if nccl:
        fig.add_trace(go.Bar(y=names, x=[r["nccl_bytes"] for r in rows], orientation="h", marker_color="#ef6c00",
                             showlegend=False, text=[f"{_bytes(r['nccl_bytes'])} ({r['nccl_calls']:,})" for r in rows],
                             textposition="auto"), 1, 3)
    fig.update_yaxes(autorange="reversed", automargin=True)
    fig.update_layout(height=max(220, 90 + 34 * len(rows)), margin=dict(l=20, r=20, t=40, b=30))
    return fig


def _call_text(span) -> str:
    """What a call did, in a few words: the kernel and its launch shape, the copy, the
    NCCL op and its bytes, or the kernels a graph launch ran."""
    a = span.attributes or {}
    kernel = a.get(sc.GPU_KERNEL_NAME)
    if kernel or sc.GPU_GRID in a:
        shape = "x".join(map(str, a.get(sc.GPU_GRID, ()))) + " / " + "x".join(map(str, a.get(sc.GPU_BLOCK, ())))
        text = f"{(kernel or a.get(sc.GPU_KERNEL_FUNC, '?')).split('(', 1)[0]}  {shape}"
    elif sc.GPU_MEMCPY_BYTES in a:
        text = f"{a.get(sc.GPU_MEMCPY_DIRECTION, '')} {_bytes(a[sc.GPU_MEMCPY_BYTES])}"
    elif sc.GPU_ALLOC_BYTES in a:
        text = _bytes(a[sc.GPU_ALLOC_BYTES])
    elif sc.GPU_NCCL_OP in a:
        rank = (f" rank {a[sc.GPU_NCCL_COMM_RANK]}/{a[sc.GPU_NCCL_COMM_NRANKS]}"
                if sc.GPU_NCCL_COMM_NRANKS in a else "")
        text = f"{a[sc.GPU_NCCL_OP]} {_bytes(a.get(sc.GPU_NCCL_BYTES, 0))}{rank}"
    elif sc.GPU_GRAPH_KERNELS in a:
        text = graph_kernels_text(a)
    else:
        text = ""
    return f"{span.name}  {text}".strip()


def _waterfall_rows(request: list, windows: list[list]) -> list[dict]:
    """Rows top to bottom: the server span, its calls by start, then each related window and its calls."""
    server = next(s for s in request if s.kind == SpanKind.SERVER)
    t0 = server.start_time
    rows = []

    def add(span, category: str, text: str) -> None:
        a = span.attributes or {}
        rows.append({"text": text, "category": category, "start_ms": (span.start_time - t0) / 1e6,
                     "dur_ms": (span.end_time - span.start_time) / 1e6, "span": span,
                     "thread": a.get(sc.THREAD_ID), "kernel": a.get(sc.GPU_KERNEL_NAME),
                     # device-clock mode: when the device ran its work, ms on the same axis
                     "device": ((span.start_time - t0 + a[sc.GPU_DEVICE_QUEUE_NS]) / 1e6,
                                a[sc.GPU_DEVICE_DURATION_NS] / 1e6) if sc.GPU_DEVICE_DURATION_NS in a else None})
    add(server, "request", server.name)
    for s in sorted((s for s in request if s is not server), key=lambda s: s.start_time):
        add(s, (s.attributes or {}).get(sc.GPU_ATTRIBUTION, "thread"), _call_text(s))
    for window in windows:
        root = next((s for s in window if s.parent is None), window[0])
        kind = (root.attributes or {}).get(sc.GPU_ATTRIBUTION, "outside")
        service = (root.resource.attributes or {}).get(sc.SERVICE_NAME, "") if root.resource else ""
        add(root, "window", f"{root.name} ({service})")
        for s in sorted((s for s in window if s is not root), key=lambda s: s.start_time):
            add(s, (s.attributes or {}).get(sc.GPU_ATTRIBUTION, kind), _call_text(s))
    return rows


def _waterfall(rows: list[dict]):
    import plotly.graph_objects as go
    shown = rows[:MAX_WATERFALL_ROWS]
    total = max((r["start_ms"] + r["dur_ms"] for r in shown), default=1.0) - min(r["start_ms"] for r in shown)
    least = max(total * 0.004, 1e-6)  # calls of ~0 host time get a visible sliver; hover says the real time
    labels = [_e(f"{i}. {r['text']}") if i else _e(r["text"]) for i, r in enumerate(shown)]
    fig = go.Figure()
    for category, color in COLORS.items():
        idx = [i for i, r in enumerate(shown) if r["category"] == category]
        if not idx:
            continue
        hover = []
        for i in idx:
            r = shown[i]
            extra = f"<br>kernel: {_e(r['kernel'])}" if r["kernel"] else ""
            thread = f"<br>thread {r['thread']}" if r["thread"] is not None else ""
            hover.append(f"{labels[i]}<br>attribution: {category}{thread}<br>start +{r['start_ms']:.3f} ms, "
                         f"host time {r['dur_ms'] * 1000:.1f} µs{extra}")
        fig.add_trace(go.Bar(y=[labels[i] for i in idx], x=[max(shown[i]["dur_ms"], least) for i in idx],
                             base=[shown[i]["start_ms"] for i in idx], orientation="h", name=category,
                             marker_color=color, hovertext=hover, hoverinfo="text"))
    timed = [i for i, r in enumerate(shown) if r["device"]]
    if timed:  # on each call's own row, over its host bar
        fig.add_trace(go.Bar(y=[labels[i] for i in timed], x=[max(shown[i]["device"][1], least) for i in timed],
                             base=[shown[i]["device"][0] for i in timed], orientation="h", name="device",
                             marker_color=DEVICE_COLOR, width=0.35, hoverinfo="text",
                             hovertext=[f"{labels[i]}<br>on the device from +{shown[i]['device'][0]:.3f} ms, "
                                        f"for {shown[i]['device'][1] * 1000:.1f} µs" for i in timed]))
    fig.update_yaxes(autorange="reversed", automargin=True, categoryorder="array", categoryarray=labels,
                     tickfont=dict(family="monospace", size=11))
    fig.update_xaxes(title_text="ms from the request's start (host time; device lane: the device's clock)"
                     if timed else "ms from the request's start (host time)")
    fig.update_layout(height=160 + 20 * len(shown), barmode="overlay", bargap=0.25,
                      legend=dict(title=dict(text="attribution")), margin=dict(l=20, r=20, t=20, b=40))
    return fig


TIME_HEADS = {"on_cpu": "on CPU", "cpu_wait": "CPU wait", "gpu_sync": "GPU sync", "blocked": "blocked"}


def _time_cells(r: dict) -> str:
    """Where a request's time went, ms (pipeline/time_split.py); * where its thread was shared."""
    split = r.get("time_split")
    if not split:
        return "".join("<td class=num>-</td>" for _ in TIME_PARTS)
    mark = "*" if r.get("time_shared") else ""
    return "".join(f"<td class=num>{split[p] * 1e3:.1f}{mark}</td>" for p in TIME_PARTS)


def _slowest_table(slow: list[dict], chosen: Optional[str], many: bool) -> str:
    head = ("<tr><th>time (UTC)</th><th>trace</th>" + ("<th>service</th>" if many else "")
            + "<th>request</th><th class=num>HTTP</th><th class=num>duration</th><th class=num>launches</th>"
            + "".join(f"<th class=num>{TIME_HEADS[p]} ms</th>" for p in TIME_PARTS) + "</tr>")
    body = []
    for r in slow:
        cls = ' class="shown"' if r["trace_id"] == chosen else ""
        body.append(f"<tr{cls}><td>{_utc(r['ts'])}</td><td><code>{_e(r['trace_id'])}</code></td>"
                    + (f"<td>{_e(r['service'])}</td>" if many else "")
                    + f"<td>{_e(r['method'] or '?')} {_e(r['route'] or '?')}</td>"
                    f"<td class=num>{_e(r['status_code'] or '-')}</td>"
                    f"<td class=num>{r['duration_ns'] / 1e6:.2f} ms</td><td class=num>{r['launches']}</td>"
                    + _time_cells(r) + "</tr>")
    return f"<table id=slowest>{head}{''.join(body)}</table>"


def _time_split_table(report: dict, many: bool) -> str:
    """Per route, the mean time split of its split requests (store/report.py time_split)."""
    rows = "".join(f"<tr><td>{_e(_label(t['service'], t['feature'], many))}</td><td class=num>{t['requests']}</td>"
                   f"<td class=num>{t['shared']}</td>"
                   + "".join(f"<td class=num>{t[p + '_ms']:.1f}</td>" for p in TIME_PARTS) + "</tr>"
                   for t in report["time_split"])
    return ("<table id=time-split><tr><th>route</th><th class=num>requests split</th><th class=num>shared</th>"
            + "".join(f"<th class=num>{TIME_HEADS[p]} ms</th>" for p in TIME_PARTS) + "</tr>" + rows + "</table>")


def _calls_table(rows: list[dict]) -> str:
    lines = []
    for r in rows[1:MAX_WATERFALL_ROWS]:
        a = r["span"].attributes or {}
        grid = "x".join(map(str, a.get(sc.GPU_GRID, ()))) or ""
        block = "x".join(map(str, a.get(sc.GPU_BLOCK, ()))) or ""
        nbytes = a.get(sc.GPU_MEMCPY_BYTES, a.get(sc.GPU_ALLOC_BYTES))
        device_us = "" if r["device"] is None else f"{r['device'][1] * 1000:.1f}"
        lines.append(f"<tr><td>{_e(r['span'].name)}</td><td>{_e(r['kernel'] or '')}</td><td>{grid}</td>"
                     f"<td>{block}</td><td class=num>{'' if nbytes is None else _e(nbytes)}</td>"
                     f"<td>{_e(r['category'])}</td><td class=num>{_e(r['thread'] if r['thread'] is not None else '')}</td>"
                     f"<td class=num>{r['start_ms']:.3f}</td><td class=num>{r['dur_ms'] * 1000:.1f}</td>"
                     f"<td class=num>{device_us}</td></tr>")
    return ("<details><summary>the calls as a table</summary><table id=calls><tr><th>call</th><th>kernel</th>"
            "<th>grid</th><th>block</th><th class=num>bytes</th><th>attribution</th><th class=num>thread</th>"
            "<th class=num>start ms</th><th class=num>host µs</th><th class=num>device µs</th></tr>"
            + "".join(lines) + "</table></details>")


def build_page(conn, since_ns: Optional[int] = None, service: Optional[str] = None, trace_id: Optional[str] = None,
               store_path: str = "", slowest: int = 10, now: Optional[datetime] = None) -> str:
    """The page as one string. `trace_id` (full id) is drawn as the waterfall; default the slowest request."""
    report = build_report(conn, since_ns, service, now)
    series = cost_series(conn, since_ns, service)
    slow = list_requests(conn, since_ns, service, slowest=slowest)
    chosen = trace_id or (slow[0]["trace_id"] if slow else None)
    requests, windows = traces_with_windows(conn, [chosen]) if chosen else ([], [])
    many = len({r["service"] for r in report["rows"]}) > 1
    t = report["totals"]
    currency = report["currency"] or ""
    scope = f"service {report['service']}" if report["service"] else "all services"
    meta = (f"{_e(scope)}, {'since ' + _e(report['since']) if report['since'] else 'everything kept'}; "
            f"store {_e(store_path)}; generated {_e(report['generated_at'])}")
    parts = [f"<div class=totals><div><b>{t['requests']:,}</b>requests</div>"
             f"<div><b>{t['gpu_seconds']:.4g}</b>GPU seconds</div>"
             f"<div><b>{t['cost']:.3g} {_e(currency)}</b>estimated cost</div>"
             f"<div><b>{'-' if t['p95_ms'] is None else near_mark(t) + format(t['p95_ms'], '.2f') + ' ms'}</b>"
             "p95 latency</div></div>"]
    if not report["rows"]:
        parts.append("<p id=empty>No requests in the store for this filter.</p>")
    else:
        parts.append("<h2>GPU cost and GPU seconds per route over time</h2>")
        parts.append(_html(_over_time(series, report, many), True, "over-time"))
        parts.append("<h2>Kernel launches and bytes copied per route"
                     + (", NCCL bytes and calls" if t["nccl_calls"] else "") + "</h2>")
        parts.append(_html(_per_route(report, many), False, "per-route"))
        if report["time_split"]:
            parts.append("<h2>Where the time went, per route</h2>" + _time_split_table(report, many)
                         + "<p class=note>Mean ms per request, on its serving thread: running, waiting for a "
                         "CPU, inside a synchronising GPU call, off the CPU otherwise. Shared: the thread served "
                         "other work meanwhile, so the split is the thread's, not the request's alone.</p>")
        note = summarised_note(conn, since_ns, service)
        parts.append(f"<h2>The {len(slow)} slowest requests</h2>" + _slowest_table(slow, chosen, many)
                     + "<p class=note>Draw another as the waterfall: <code>otel-gpu report --html FILE "
                     "--trace TRACE</code>. Time split ms: * where its thread was shared."
                     + (f" {_e(note)}." if note else "") + "</p>")
    if requests:
        rows = _waterfall_rows(requests[0], windows)
        server = rows[0]["span"]
        parts.append(f"<h2>Trace <code>{_e(chosen)}</code>: {_e(server.name)}, "
                     f"{(server.end_time - server.start_time) / 1e6:.2f} ms</h2>"
                     "<p class=note>The request's CUDA calls, then the windows of GPU work it may share "
                     "(ambiguous, shared) or that ran beside it (outside). Colour: how each call was "
                     "attributed. Calls of ~0 host time are drawn as a sliver.</p>")
        if len(rows) > MAX_WATERFALL_ROWS:
            parts.append(f"<p class=note>{len(rows) - MAX_WATERFALL_ROWS} more calls not drawn.</p>")
        parts.append(_html(_waterfall(rows), not report["rows"], "waterfall"))
        parts.append(_calls_table(rows))
    title = "otel-gpu report"
    return Template(TEMPLATE.read_text(encoding="utf-8")).substitute(title=title, meta=meta, body="\n".join(parts))
