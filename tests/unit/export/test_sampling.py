"""Trace sampling (export/sampling.py) through the span builder: OTEL_TRACES_SAMPLER's
names and ratio, the parent's sampled flag honoured, a ratio sampling about its share of
traces, and an unsampled trace's spans (children too) flagged so OTLP drops them while
the store keeps them."""
import random

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult

from otel_gpu.config import ConfigError, load_config
from otel_gpu.export import sampling
from otel_gpu.export.destinations import QueuedExporter
from otel_gpu.export.spans import SpanBuilder
from otel_gpu.ratelimit import Stats
from tests.unit.export.test_spans import BpfClock, request


def built(name, arg=None, parent=None, parent_sampled=None, trace_id=0xABC):
    stats = Stats()
    b = SpanBuilder(BpfClock(), sampler=sampling.make(name, arg), stats=stats)
    r = request(parent=(trace_id, parent) if parent else None)
    r.trace_id, r.parent_sampled = trace_id, parent_sampled
    spans = b.build(r)
    flags = {s.context.trace_flags.sampled for s in spans}
    assert len(flags) == 1 and len(spans) == 4  # the server span and its children alike
    return flags.pop(), stats.snapshot().get("traces_unsampled", 0)


def test_the_named_samplers():
    assert built("always_on") == (True, 0)
    assert built("always_off") == (False, 1)
    assert built("traceidratio", "0") == (False, 1) and built("traceidratio", "1") == (True, 0)
    assert built("parentbased_always_off")[0] is False
    assert built("parentbased_always_on")[0] is True


def test_the_parent_decides_under_parentbased():
    assert built("parentbased_always_on", parent=0x77, parent_sampled=False)[0] is False
    assert built("parentbased_traceidratio", "0", parent=0x77, parent_sampled=True)[0] is True
    assert built("traceidratio", "0", parent=0x77, parent_sampled=True)[0] is False  # not parent-based


def test_a_ratio_samples_about_its_share():
    rng, sampler = random.Random(5), sampling.make("traceidratio", "0.1")
    n = sum(sampling.sampled(sampler, rng.getrandbits(128) or 1, "GET /", None) for _ in range(2000))
    assert 140 <= n <= 260


def test_bad_settings_are_refused():
    with pytest.raises(ValueError):
        sampling.make("sometimes", None)
    with pytest.raises(ValueError):
        sampling.make("traceidratio", "1.5")
    with pytest.raises(ConfigError, match="OTEL_TRACES_SAMPLER"):
        load_config(None, {"OTEL_TRACES_SAMPLER": "sometimes"})
    c = load_config(None, {"OTEL_TRACES_SAMPLER": " TraceIdRatio ", "OTEL_TRACES_SAMPLER_ARG": "0.25"})
    assert (c.traces_sampler, c.traces_sampler_arg) == ("traceidratio", "0.25")
    assert load_config(None, {}).traces_sampler == "parentbased_always_on"


def test_otlp_takes_sampled_spans_only():
    class Sink:
        got = []

        def export(self, spans):
            self.got += spans
            return SpanExportResult.SUCCESS

        def shutdown(self):
            pass
    q = QueuedExporter(Sink(), Stats(), schedule_delay_ms=10)
    b = SpanBuilder(BpfClock(), sampler=sampling.make("always_off", None))
    assert q.export(b.build(request())) == SpanExportResult.SUCCESS and q.pending == 0
    q.shutdown()
    assert Sink.got == []
