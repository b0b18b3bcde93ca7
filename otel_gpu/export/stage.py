"""Stage: builds the spans of each finished request and window and hands them to the
destinations (console tree, local store, OTLP), and a cost settled after its request's
span left to those that keep summaries; passes every record on."""
from __future__ import annotations

from ..pipeline.model import ProcessWindow, Request
from ..records import RequestCost
from .spans import SpanBuilder


class ExportStage:
    def __init__(self, builder: SpanBuilder, destinations) -> None:
        self.builder = builder
        self.destinations = destinations  # export.destinations.Destinations

    def process(self, records: list) -> list:
        for r in records:
            if isinstance(r, Request) and r.records_lost:  # partial: the kernel counted it (RequestSummary)
                if self.builder.stats is not None:
                    self.builder.stats.add("spans_records_lost")
            elif isinstance(r, Request) and not r.sampled and not self.destinations.keep_unsampled:
                self.builder.counted(False)  # no destination would keep its spans: not built
            elif isinstance(r, (Request, ProcessWindow)):
                self.destinations.export(self.builder.build(r))
            elif isinstance(r, RequestCost):
                self.destinations.settle_cost(r.request, self.builder.currency)
        return records

    def close(self, deadline: float) -> None:
        self.destinations.shutdown(deadline)
