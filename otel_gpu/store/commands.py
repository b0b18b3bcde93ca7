"""The `report` and `traces` subcommands: read-only, no root needed."""
from __future__ import annotations

import argparse
import shutil
import sqlite3
import sys

from .paths import default_store_path
from .schema import StoreError, open_reader
from .since import parse_since

COMMANDS = ("report", "traces")


def _common(p: argparse.ArgumentParser) -> None:
    p.add_argument("--db", default=None, metavar="PATH",
                   help="local store to read (default: $OTEL_GPU_STORE, /var/lib/otel-gpu/otel-gpu.db, "
                        "or ~/.local/state/otel-gpu/otel-gpu.db)")
    p.add_argument("--since", metavar="WHEN", help="only requests since WHEN: 15m, 2h, 1d, or an ISO time")
    p.add_argument("--service", help="only this service.name")


def add_parsers(subparsers) -> None:
    r = subparsers.add_parser("report", help="per-route GPU usage and cost from the local store")
    _common(r)
    r.add_argument("--format", choices=("text", "json"), default="text",
                   help="json: the object documented in the README")
    r.add_argument("--html", metavar="FILE", help="also write a self-contained HTML page with charts to FILE")
    r.add_argument("--trace", metavar="ID", help="with --html: the trace drawn as a waterfall (default: the slowest)")
    r.set_defaults(store_command="report")
    t = subparsers.add_parser("traces", help="list recent traces from the local store, or show one as a tree")
    _common(t)
    t.add_argument("--route", help="only requests with this http.route (or otel_gpu.feature)")
    t.add_argument("--slowest", type=int, metavar="N", help="the N slowest requests instead of the newest")
    t.add_argument("--trace-id", metavar="ID", help="show this trace (full id or a unique prefix) as a tree")
    t.add_argument("--limit", type=int, default=20, help="how many requests to list (default 20)")
    t.add_argument("--format", choices=("text", "perfetto"), default="text",
                   help="perfetto: the listed requests (or --trace-id) with their CUDA calls as Chrome "
                        "trace-event JSON, for ui.perfetto.dev")
    t.add_argument("--output", metavar="FILE", help="with --format perfetto: write to FILE instead of stdout")
    t.set_defaults(store_command="traces")


def _err(msg: str, code: int) -> int:
    print(f"otel-gpu: {msg}", file=sys.stderr)
    return code


def _width(out) -> int:
    """The terminal's width on a terminal; 80 into a pipe or file, so output is stable."""
    isatty = getattr(out, "isatty", lambda: False)
    return max(80, shutil.get_terminal_size((80, 24)).columns) if isatty() else 80


def dispatch(args, out=None) -> int:
    """Runs `report` or `traces`; 0 ok, 1 no such store/trace, 2 bad arguments."""
    out = out or sys.stdout
    path = args.db or default_store_path()
    try:
        since = parse_since(args.since)
    except ValueError as e:
        return _err(str(e), 2)
    for name in ("slowest", "limit"):
        if getattr(args, name, None) is not None and getattr(args, name) < 1:
            return _err(f"--{name} must be at least 1", 2)
    try:
        conn = open_reader(path)
    except FileNotFoundError:
        return _err(f"no local store at {path}: run `otel-gpu run` first (or --db)", 1)
    except StoreError as e:
        return _err(str(e), 1)
    try:
        if args.store_command == "report":
            if args.html:
                code = _html(conn, args, since, path)
                if code:
                    return code
            from .report import build_report, to_json
            from .report_text import to_text
            report = build_report(conn, since, args.service)
            out.write((to_json(report) if args.format == "json" else to_text(report, _width(out))) + "\n")
            return 0
        return _traces(conn, args, since, path, out)
    except (StoreError, sqlite3.Error) as e:
        return _err(f"reading {path}: {e}" if isinstance(e, sqlite3.Error) else str(e), 1)
    finally:
        conn.close()


def _one_trace(conn, prefix: str, flag: str, path: str):
    """The full trace id for a prefix, or the exit code after saying why not."""
    from .traces import resolve_trace_id
    try:
        ids = resolve_trace_id(conn, prefix)
    except ValueError as e:
        return _err(str(e).replace("--trace-id", flag), 2)
    if not ids:
        return _err(f"no trace {prefix} in the local store {path}", 1)
    if len(ids) > 1:
        return _err(f"trace id prefix {prefix} is ambiguous: give more digits", 2)
    return ids[0]


def _write_file(file: str, text: str, what: str) -> int:
    try:
        with open(file, "w", encoding="utf-8") as f:
            f.write(text)
    except OSError as e:
        return _err(f"cannot write {what} {file}: {e.strerror}", 1)
    return 0


def _html(conn, args, since, path: str) -> int:
    from .html_report import build_page
    trace_id = None
    if args.trace:
        trace_id = _one_trace(conn, args.trace, "--trace", path)
        if isinstance(trace_id, int):
            return trace_id
    page = build_page(conn, since, args.service, trace_id=trace_id, store_path=path)
    code = _write_file(args.html, page, "the HTML report")
    if not code:
        print(f"otel-gpu: wrote {args.html} ({len(page) // 1024} KiB, self-contained)", file=sys.stderr)
    return code


def _traces(conn, args, since, path: str, out) -> int:
    from .traces import format_list, format_tree, list_requests, summarised_note, trace_spans
    if args.output and args.format != "perfetto":
        return _err("--output goes with --format perfetto", 2)
    if args.trace_id:
        trace_id = _one_trace(conn, args.trace_id, "--trace-id", path)
        if isinstance(trace_id, int):
            return trace_id
        if args.format == "perfetto":
            return _perfetto(conn, [trace_id], args.output, out)
        out.write(format_tree(trace_spans(conn, trace_id)) + "\n")
        return 0
    rows = list_requests(conn, since, args.service, args.route, args.slowest, args.limit)
    if args.format == "perfetto":
        return _perfetto(conn, [r["trace_id"] for r in rows], args.output, out)
    out.write(format_list(rows, _width(out)) + "\n")
    note = summarised_note(conn, since, args.service, args.route)
    if note:
        out.write(note + "\n")
    return 0


def _perfetto(conn, trace_ids: list[str], output, out) -> int:
    from .perfetto import to_json, trace_events
    from .related import traces_with_windows
    requests, windows = traces_with_windows(conn, trace_ids)
    text = to_json(trace_events(requests, windows)) + "\n"
    if not output:
        out.write(text)
        return 0
    code = _write_file(output, text, "the trace")
    if not code:
        print(f"otel-gpu: wrote {len(requests)} requests and {len(windows)} GPU-work windows to {output}: "
              "open it at ui.perfetto.dev", file=sys.stderr)
    return code
