"""build_destinations: the export list from configuration. It lives here, beside the
collector, because it joins export/ (console, OTLP) and store/, which do not import
each other."""
from __future__ import annotations

import logging
import sys
from typing import TextIO

from .config import Config
from .export.console import ConsoleTreeExporter
from .export.destinations import Destinations, QueuedExporter, otlp_span_exporter
from .ratelimit import Stats
from .store.exporter import StoreExporter
from .store.schema import StoreError

log = logging.getLogger(__name__)


def build_destinations(config: Config, stats: Stats, out: TextIO = sys.stdout) -> Destinations:
    """console, store, otlp: each when configured, in that order. A store that cannot be
    written (full disk, read-only, permission, a newer schema) is one error line and left
    out (store_disabled), the others unaffected; when it is the only destination, the
    StoreError is raised (`otel-gpu run` exits 2). An unknown protocol: ValueError."""
    # Made first: a bad protocol fails before the store file is created.
    otlp = otlp_span_exporter(config.otlp_protocol) if config.otlp_traces else None
    exporters = []
    if config.console:
        exporters.append(("console", ConsoleTreeExporter(out)))
    if config.store_path:
        try:
            exporters.append(("store", StoreExporter(config.store_path, stats=stats, group=config.store_group)))
        except StoreError as e:
            others = [name for name, _ in exporters] + (["otlp"] if otlp is not None else [])
            if not others:
                raise
            stats.add("store_disabled")
            log.error("%s; running on without it: spans still go to %s", e, " and ".join(others))
    if otlp is not None:  # the batch worker thread starts only once nothing else can fail
        exporters.append(("otlp", QueuedExporter(otlp, stats, config.queue_size, config.export_batch_size,
                                                 config.schedule_delay_ms)))
    return Destinations(exporters, stats)
