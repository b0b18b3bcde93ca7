"""Embedded local store: spans and per-request GPU summaries in SQLite (WAL), read by
`otel-gpu report` and `otel-gpu traces`.

    exporter.py  StoreExporter: the collector's writer (an SDK SpanExporter), bounded retention
    schema.py    tables, schema version, opening for write / read-only
    paths.py     default_store_path()
    since.py     --since parsing
    report.py    per-(service, feature) table, text or JSON (fields documented there)
    traces.py    request list and trace trees
    text.py      column fitting shared by both
    commands.py  add_parsers() / dispatch() for the CLI
"""
