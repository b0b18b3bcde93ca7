"""The collector for the bench: the tests' CollectorProcess (tests/support: its counts come
from the final state in its status file) with the bench's defaults: --no-store (the
bench's targets stay out of the user's store), OTLP to the given receiver with a 200 ms
span batch delay, stopped with SIGINT; every BPF load time kept for item 4."""
from __future__ import annotations

import os
import signal

from tests.support.collector_process import CollectorProcess

# OTEL_METRIC_EXPORT_INTERVAL where an item measures how soon the metrics count a request
# (the collector's default, 10 s, would put the export timer's phase into that figure).
METRIC_INTERVAL_MS = 1000


class Collector(CollectorProcess):
    loads: list = []  # load_s of every collector this run started (item 4's split of `ready`)

    def __init__(self, otlp_endpoint: str | None = None, args: tuple = (), env: dict | None = None) -> None:
        """env: variables for the collector over the bench's own; a None value unsets one."""
        over = {k: None for k in os.environ if k.startswith("OTEL_EXPORTER_OTLP")}
        if otlp_endpoint:
            over.update(OTEL_EXPORTER_OTLP_ENDPOINT=otlp_endpoint, OTEL_BSP_SCHEDULE_DELAY="200")
        over.update(env or {})
        # --no-store first (an item's own --store wins).
        super().__init__(("--no-store", *args), over, ready_timeout=90)
        if self.load_s is not None:
            Collector.loads.append(self.load_s)

    def stop(self) -> dict:
        """SIGINT, wait, and the run's counts (empty when it left no final state)."""
        super().stop(signal.SIGINT, 60)
        return self.counts()

    @staticmethod
    def per_request(summary: dict, counter: str):
        """A counted figure (`counter`, such as cuda_calls_streamed) per request the collector
        finished, or None when it left no final state."""
        if "counted" not in summary or not summary.get("requests"):
            return None
        return summary["counted"].get(counter, 0) / summary["requests"]

    @staticmethod
    def lost_events(summary: dict):
        """Records the kernel could not hand over (`lost_events`, counted only once
        non-zero), or None when the collector left no final state: never a made-up 0."""
        return summary["dropped"].get("lost_events", 0) if "dropped" in summary else None


def known(value, missing: str = "the collector left no final state") -> str:
    """A figure for the table, or why it is not known."""
    return f"not known ({missing})" if value is None else str(value)
