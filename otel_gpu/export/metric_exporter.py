"""The OTLP metric exporter: the SDK's own (gRPC or HTTP/protobuf), told how many of its
exports were still running when it is shut down. At the shutdown deadline those are
abandoned, and counted (metrics_dropped_shutdown: exports, each of every metric point),
never silently lost."""
from __future__ import annotations

import logging
import threading

from ..ratelimit import Stats

log = logging.getLogger(__name__)


def otlp_metric_exporter(protocol: str, stats: Stats):
    """It reads OTEL_EXPORTER_OTLP_{,METRICS_}ENDPOINT/HEADERS/TIMEOUT itself."""
    if protocol == "grpc":
        from opentelemetry.exporter.otlp.proto.grpc.metric_exporter import OTLPMetricExporter
    else:
        from opentelemetry.exporter.otlp.proto.http.metric_exporter import OTLPMetricExporter

    class CountedAtShutdown(OTLPMetricExporter):
        def __init__(self) -> None:
            super().__init__()
            self._lock = threading.Lock()
            self._running = 0

        def export(self, metrics_data, timeout_millis: float = 10_000, **kwargs):
            with self._lock:
                self._running += 1
            try:
                return super().export(metrics_data, timeout_millis=timeout_millis, **kwargs)
            finally:
                with self._lock:
                    self._running -= 1

        def shutdown(self, timeout_millis: float = 30_000, **kwargs) -> None:
            # The reader calls this once its final export returned or its time is up.
            with self._lock:
                running = self._running
            if running:
                stats.add("metrics_dropped_shutdown", running)
                log.warning("OTLP metrics: %d export(s) not delivered by the shutdown deadline", running)
            super().shutdown(timeout_millis=timeout_millis, **kwargs)

    return CountedAtShutdown()
