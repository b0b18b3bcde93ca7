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

log = logging.getLogger(__name__)


def build_destinations(config: Config, stats: Stats, out: TextIO = sys.stdout) -> Destinations:
    """console, store, otlp: each when configured, in that order. Opening the store can
    raise StoreError (a newer schema) or OSError; an unknown protocol, ValueError."""
    # Made first: a bad protocol fails before the store file is created.
    otlp = otlp_span_exporter(config.otlp_protocol) if config.otlp_traces else None
    exporters = []
    if config.console:
        exporters.append(("console", ConsoleTreeExporter(out)))
    if config.store_path:
        log.info("local store: %s (otel-gpu report / otel-gpu traces read it)", config.store_path)
        exporters.append(("store", StoreExporter(config.store_path)))
    if otlp is not None:  # the batch worker thread starts only once nothing else can fail
        exporters.append(("otlp", QueuedExporter(otlp, stats, config.queue_size, config.export_batch_size,
                                                 config.schedule_delay_ms)))
    return Destinations(exporters, stats)
