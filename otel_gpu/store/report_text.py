"""`otel-gpu report`'s text table: the report object (report.py) in aligned columns within a
terminal's width, with its notes (cost per streamed chunk, where the time went)."""
from __future__ import annotations

from typing import Optional

from .report import TIME_PARTS
from .text import fit, split_width

OUTSIDE_LABEL = "(outside)"  # the table's name for the feature-null row


def _ms(v: Optional[float]) -> str:
    if v is None:
        return "-"
    return f"{v:.2f}" if v < 10 else f"{v:.1f}" if v < 1000 else f"{v:.0f}"


def _bytes(n: float) -> str:
    """1024-based, at most 5 characters below a petabyte: 512B, 4.0K, 47M."""
    unit = "B"
    for unit in ("B", "K", "M", "G", "T"):
        if n < 1024 or unit == "T":
            break
        n /= 1024
    return f"{int(n)}B" if unit == "B" else f"{n:.1f}{unit}" if n < 10 else f"{n:.0f}{unit}"


def _sig(v: float) -> str:
    return "0" if v == 0 else f"{v:.3g}"


# GPU s is the row's whole time, SPLIT s the part of it split from ambiguous/shared windows
# (exact = GPU s - SPLIT s). NCCL (bytes) is there only when some request made NCCL calls.
# When the names need the room, NCCL, then COPY, then L/REQ go (JSON keeps every field).
_NUMERIC = (("REQS", 5), ("P50 ms", 6), ("P95 ms", 6), ("L/REQ", 5), ("COPY", 5), ("NCCL", 5), ("GPU s", 7),
            ("SPLIT s", 7), ("COST", 8), ("SHARE", 6))
_OPTIONAL = ("NCCL", "COPY", "L/REQ")


def near_mark(figures: dict) -> str:
    """'~' before a row's (or the totals') percentiles read from summarised requests'
    duration buckets (the text table's footnote; the HTML page's p95)."""
    return "~" if figures["percentiles"] == "buckets" else ""


def _cells(r: dict) -> dict:
    near = near_mark(r)
    return {"REQS": str(r["requests"]), "P50 ms": near + _ms(r["p50_ms"]), "P95 ms": near + _ms(r["p95_ms"]),
            "L/REQ": f"{r['launches_per_request']:.1f}", "COPY": _bytes(r["copy_bytes"]),
            "NCCL": _bytes(r["nccl_bytes"]),
            "GPU s": _sig(r["gpu_seconds"]), "SPLIT s": _sig(r["split_gpu_seconds"]), "COST": _sig(r["cost"]),
            "SHARE": f"{r['share'] * 100:.1f}%"}


def _columns(width: int, services: list[str], features: list[str], nccl: bool) -> tuple[list, int]:
    """The numeric columns that fit beside the names, and the width left for the names."""
    columns = [c for c in _NUMERIC if nccl or c[0] != "NCCL"]
    need = max(map(len, features)) + (max(map(len, services)) + 1 if len(services) > 1 else 0)
    for name in _OPTIONAL:
        if need <= width - sum(w + 1 for _, w in columns):
            break
        columns = [c for c in columns if c[0] != name]
    return columns, width - sum(w + 1 for _, w in columns)


def to_text(report: dict, width: int = 80) -> str:
    """An aligned table within `width` (at least 80) columns."""
    width = max(80, width)
    rows = report["rows"]
    services = sorted({r["service"] for r in rows})
    features = [r["feature"] or OUTSIDE_LABEL for r in rows] or [""]
    columns, name_w = _columns(width, services or [""], features, report["totals"]["nccl_calls"] > 0)
    if len(services) > 1:
        svc_w, feat_w = split_width(name_w, services, features)
    else:
        svc_w, feat_w = 0, name_w
    cost_head = f"COST {report['currency']}" if report["currency"] and report["currency"] != "mixed" else "COST"
    since = f"since {report['since']}" if report["since"] else "all kept"
    scope = f"service {report['service']}" if report["service"] else (
        f"service {services[0]}" if len(services) == 1 else f"{len(services)} services")
    lines = [f"otel-gpu report: {scope}, {since}, {report['totals']['requests']} requests",
             f"share of {report['share_of'].replace('_', ' ')}; cost in {report['currency'] or 'n/a'}"]
    if not rows:
        return "\n".join(lines + ["no requests in the store for this filter"])

    def line(name_cells: list[str], cells: dict) -> str:
        return " ".join(name_cells + [cells[h].rjust(w) for h, w in columns]).rstrip()

    def names(service: str, feature: str) -> list[str]:
        return ([fit(service, svc_w)] if svc_w else []) + [fit(feature, feat_w)]

    heads = {h: h if h != "COST" else cost_head[:8] for h, _ in columns}
    lines.append(line(names("SERVICE", "FEATURE"), heads))
    lines += [line(names(r["service"], r["feature"] or OUTSIDE_LABEL), _cells(r)) for r in rows]
    lines.append(line(names("TOTAL", "") if svc_w else names("", "TOTAL"), _cells(report["totals"])))
    if report["per_chunk"]:
        lines.append("per streamed response chunk (an SSE token each):")
        lines += [f"  {fit(c['feature'] or '', feat_w)} {c['chunks']:>10} chunks"
                  f" {c['gpu_seconds_per_chunk'] * 1e3:10.3f} GPU ms"
                  f" {_sig(c['cost_per_chunk'] * 1e6):>10} {report['currency'] or ''} per 1M"
                  for c in report["per_chunk"]]
    if report.get("time_split"):
        lines.append("where the time went, mean ms per request (on its serving thread):")
        head = f"  {fit('FEATURE', feat_w)} {'REQS':>6} {'ON CPU':>8} {'CPU WAIT':>8} {'GPU SYNC':>8} {'BLOCKED':>8}"
        lines.append(head.rstrip())
        for t in report["time_split"]:
            shared = f" ({t['shared']} shared)" if t["shared"] else ""
            lines.append(f"  {fit(t['feature'] or '', feat_w)} {t['requests']:>6}"
                         + "".join(f" {_ms(t[f'{p}_ms']):>8}" for p in TIME_PARTS) + shared)
    if report["totals"]["summarised"]:
        lines.append(f"~ P50/P95: from the duration buckets of the {report['totals']['summarised']} requests "
                     "summarised")
        lines.append("(not sampled, no error), at most 9 % above the true value.")
    lines.append("GPU s = exact + SPLIT s (ambiguous/shared windows' time, split among their")
    lines.append("candidates: a batch step's among its members); (outside): the service's GPU time")
    lines.append("with no request open.")
    lines.append("GPU seconds and cost are host-side estimates; CUDA timings are enqueue times.")
    return "\n".join(lines)
