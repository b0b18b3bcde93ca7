"""Stage: builds the spans of each finished request and window and hands them to the
destinations (console tree, local store, OTLP), and a cost settled after its request's
span left to those that keep summaries; passes every record on.

An unsampled request that did not end in an error is built as far as some destination
keeps it (Destinations.unsampled): whole, its SERVER span alone (the store sums it), or
not at all (counted)."""
from __future__ import annotations

from ..pipeline.model import ProcessWindow, Request
from ..records import RequestCost, Tick
from .destinations import NOTHING, SUMMARY, WHOLE
from .spans import SpanBuilder, ends_in_error


class ExportStage:
    def __init__(self, builder: SpanBuilder, destinations) -> None:
        self.builder = builder
        self.destinations = destinations  # export.destinations.Destinations
        self.unsampled = destinations.unsampled  # the destinations are fixed at start

    def process(self, records: list) -> list:
        self.destinations.begin_batch()  # the store writes the batch in one transaction
        try:
            for r in records:
                if isinstance(r, Request) and r.records_lost:  # partial: the kernel counted it (RequestSummary)
                    if self.builder.stats is not None:
                        self.builder.stats.add("spans_records_lost")
                elif isinstance(r, Request) and not r.sampled and self.unsampled != WHOLE:
                    self._unsampled(r)
                elif isinstance(r, (Request, ProcessWindow)):
                    self.destinations.export(self.builder.build(r))
                elif isinstance(r, RequestCost):
                    self.destinations.settle_cost(r.request, self.builder.currency)
                elif isinstance(r, Tick):
                    self.destinations.tick()
        finally:
            self.destinations.end_batch()
        return records

    def _unsampled(self, r: Request) -> None:
        if self.unsampled == NOTHING:
            self.builder.counted(False)  # no destination would keep its spans: not built
        elif self.unsampled == SUMMARY and not ends_in_error(r):
            self.destinations.export([self.builder.server_span(r)])
        else:  # an error: the store keeps it whole
            self.destinations.export(self.builder.build(r))

    def close(self, deadline: float) -> None:
        self.destinations.shutdown(deadline)
