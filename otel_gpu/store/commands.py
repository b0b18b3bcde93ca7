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
    r.set_defaults(store_command="report")
    t = subparsers.add_parser("traces", help="list recent traces from the local store, or show one as a tree")
    _common(t)
    t.add_argument("--route", help="only requests with this http.route (or otel_gpu.feature)")
    t.add_argument("--slowest", type=int, metavar="N", help="the N slowest requests instead of the newest")
    t.add_argument("--trace-id", metavar="ID", help="show this trace (full id or a unique prefix) as a tree")
    t.add_argument("--limit", type=int, default=20, help="how many requests to list (default 20)")
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
            from .report import build_report, to_json, to_text
            report = build_report(conn, since, args.service)
            out.write((to_json(report) if args.format == "json" else to_text(report, _width(out))) + "\n")
            return 0
        return _traces(conn, args, since, path, out)
    except (StoreError, sqlite3.Error) as e:
        return _err(f"reading {path}: {e}" if isinstance(e, sqlite3.Error) else str(e), 1)
    finally:
        conn.close()


def _traces(conn, args, since, path: str, out) -> int:
    from .traces import format_list, format_tree, list_requests, resolve_trace_id, trace_spans
    if args.trace_id:
        try:
            ids = resolve_trace_id(conn, args.trace_id)
        except ValueError as e:
            return _err(str(e), 2)
        if not ids:
            return _err(f"no trace {args.trace_id} in the local store {path}", 1)
        if len(ids) > 1:
            return _err(f"trace id prefix {args.trace_id} is ambiguous: give more digits", 2)
        out.write(format_tree(trace_spans(conn, ids[0])) + "\n")
        return 0
    rows = list_requests(conn, since, args.service, args.route, args.slowest, args.limit)
    out.write(format_list(rows, _width(out)) + "\n")
    return 0
