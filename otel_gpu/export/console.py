"""Prints each trace as a tree on a terminal: the embedded default with no backend."""
from __future__ import annotations

import sys
from typing import Sequence, TextIO

from opentelemetry.sdk.trace import ReadableSpan
from opentelemetry.sdk.trace.export import SpanExporter, SpanExportResult

from ..span_tree import render_tree


class ConsoleTreeExporter(SpanExporter):
    """Called with the spans of whole traces at once (see export/destinations.py)."""

    def __init__(self, out: TextIO = sys.stdout) -> None:
        self.out = out

    def export(self, spans: Sequence[ReadableSpan]) -> SpanExportResult:
        if spans:
            self.out.write(render_tree(spans) + "\n\n")
            self.out.flush()
        return SpanExportResult.SUCCESS

    def shutdown(self) -> None:
        self.out.flush()
