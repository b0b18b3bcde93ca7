"""Trace sampling (pipeline/sampling.py): OTEL_TRACES_SAMPLER's names and ratio, the
parent's sampled flag honoured, a ratio sampling about its share of traces; an unsampled
trace's spans (children too) flagged so OTLP drops them; the stitcher deciding as a
request opens and saying when a process has only unsampled requests open (the kernel
then counts its calls instead of streaming them)."""
import dataclasses
import random

import pytest
from opentelemetry.sdk.trace.export import SpanExportResult
from opentelemetry.trace import SpanKind

from otel_gpu.config import ConfigError
from otel_gpu.config_loader import load_config
from otel_gpu.pipeline import sampling
from otel_gpu.export.destinations import QueuedExporter
from otel_gpu.export.spans import SpanBuilder
from otel_gpu.ratelimit import Stats
from tests.unit.export.test_spans import BpfClock, request


def built(name, arg=None, parent=None, parent_sampled=None, trace_id=0xABC):
    """The request's spans as the stitcher (its decision) and the span builder make them."""
    stats, sampler = Stats(), sampling.make(name, arg)
    b = SpanBuilder(BpfClock(), sampler=sampler, stats=stats)
    r = request(parent=(trace_id, parent) if parent else None)
    r.trace_id, r.parent_sampled = trace_id, parent_sampled
    r.sampled = sampling.sampled(sampler, trace_id, "GET", SpanKind.SERVER, r.parent_span_id, parent_sampled)
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
    r = request()
    r.sampled = False
    assert q.export(SpanBuilder(BpfClock()).build(r)) == SpanExportResult.SUCCESS and q.pending == 0
    q.shutdown()
    assert Sink.got == []


def test_the_stitcher_decides_and_says_when_a_process_is_quiet():
    from otel_gpu.pipeline.stitcher import Stitcher
    from tests.unit.pipeline.test_stitcher import OK, accept, get, read, write
    s = Stitcher(span_budget=8, rng=random.Random(3), sampler=sampling.make("parentbased_always_on", None))
    tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-0{}"
    s.process([accept(fd=5, pid=9), accept(fd=6, pid=9)])
    s.process([read(get("/a", f"traceparent: {tp.format(0)}\r\n".encode()), fd=5, tid=5, pid=9)])
    assert s.http.quiet == {9: True}  # its one open request is unsampled
    s.http.quiet = {}
    s.process([read(get("/b", f"traceparent: {tp.format(1)}\r\n".encode()), fd=6, tid=6, pid=9)])
    assert s.http.quiet == {9: False}  # a sampled one opened
    s.http.quiet = {}
    out = s.process([write(OK, fd=6, tid=6, pid=9)])
    assert s.http.quiet == {9: True}
    out += s.process([write(OK, fd=5, tid=5, pid=9)])
    assert s.http.quiet == {9: False}  # nothing open
    assert sorted(r.sampled for r in out if hasattr(r, "sampled")) == [False, True]


def test_a_sampler_that_drops_new_traces_keeps_a_process_quiet_but_for_sampled_requests():
    from otel_gpu.pipeline.stitcher import Stitcher
    from tests.unit.pipeline.test_stitcher import OK, accept, get, read, write
    assert sampling.drops_roots("traceidratio", "0.1") and sampling.drops_roots("always_off", None)
    assert not sampling.drops_roots("parentbased_always_on", None) and not sampling.drops_roots("traceidratio", "1")
    s = Stitcher(span_budget=8, rng=random.Random(3), sampler=sampling.make("parentbased_traceidratio", "0"),
                 quiet_when_idle=True)
    sampled = b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
    s.process([accept(fd=5, pid=9), accept(fd=6, pid=9), read(get("/a"), fd=5, tid=5, pid=9)])
    assert s.http.quiet == {}  # quiet from the start (the collector marks it as it traces it)
    s.process([read(get("/b", sampled), fd=6, tid=6, pid=9)])
    assert s.http.quiet == {9: False}
    s.http.quiet = {}
    s.process([write(OK, fd=6, tid=6, pid=9)])
    assert s.http.quiet == {9: True}
    s.http.quiet = {}
    s.process([write(OK, fd=5, tid=5, pid=9)])
    assert s.http.quiet == {}  # still quiet once idle


def test_a_window_linked_to_a_sampled_request_goes_out_with_it():
    from otel_gpu.pipeline.model import CallSink, ProcessWindow
    b = SpanBuilder(BpfClock(), sampler=sampling.make("always_off", None))
    w = ProcessWindow(9, "ambiguous", 0, 10, CallSink(4), candidates=[(1, 2)])
    assert not b.build(w)[0].context.trace_flags.sampled
    w.links_sampled = True
    assert b.build(w)[0].context.trace_flags.sampled


def test_an_unsampled_request_is_not_built_when_only_otlp_would_take_it():
    """OTLP drops an unsampled trace's spans: with no destination that keeps them (the
    store, the console), they are not built at all; counted all the same."""
    from opentelemetry.sdk.trace.export.in_memory_span_exporter import InMemorySpanExporter

    from otel_gpu.export.destinations import Destinations
    from otel_gpu.export.stage import ExportStage

    for keeper, built in ((None, 0), (InMemorySpanExporter(), 4)):
        stats = Stats()
        q = QueuedExporter(InMemorySpanExporter(), stats, schedule_delay_ms=10)
        dests = Destinations([("otlp", q)] + ([("store", keeper)] if keeper else []), stats)
        r = request()
        r.sampled = False
        ExportStage(SpanBuilder(BpfClock(), stats=stats), dests).process([r])
        q.shutdown()
        assert dests.spans_out == built and stats.snapshot()["traces_unsampled"] == 1


def test_the_kernel_bound_is_the_ratio_samplers_own():
    """bpf/head_sampling.c samples a root when its draw < kernel_bound: the bound the SDK's
    TraceIdRatioBased compares a trace id's low 64 bits with; 0 for the samplers that drop
    every root; None (the kernel decides nothing) where every root is sampled."""
    from opentelemetry.sdk.trace.sampling import TraceIdRatioBased
    assert sampling.kernel_bound("traceidratio", "0.1") == TraceIdRatioBased(0.1).bound
    assert sampling.kernel_bound("parentbased_traceidratio", "0.25") == TraceIdRatioBased(0.25).bound
    assert sampling.kernel_bound("always_off", None) == sampling.kernel_bound("parentbased_always_off", None) == 0
    for name, arg in (("always_on", None), ("parentbased_always_on", None), ("traceidratio", "1"),
                      ("parentbased_traceidratio", None)):
        assert sampling.kernel_bound(name, arg) is None, name
    assert sampling.parent_decides("parentbased_traceidratio") and not sampling.parent_decides("traceidratio")


def test_parents_decide_in_the_kernel_later_where_every_root_is_sampled():
    """The default sampler, and a parent-based ratio of 1: the kernel has no root to
    decide, but a parent's flag decides; ALL_ROOTS samples every draw the kernel makes."""
    for name, arg in (("parentbased_always_on", None), ("parentbased_traceidratio", "1")):
        assert sampling.bound_once_parents_unsampled(name, arg) == sampling.ALL_ROOTS, name
    for name, arg in (("always_on", None), ("traceidratio", "1"), ("traceidratio", "0.5"),
                      ("parentbased_traceidratio", "0.5"), ("parentbased_always_off", None)):
        assert sampling.bound_once_parents_unsampled(name, arg) is None, name


@pytest.mark.parametrize("name,arg", [("traceidratio", "0.1"), ("parentbased_traceidratio", "0.5"),
                                      ("parentbased_always_on", None), ("always_off", None)])
def test_one_plan_is_what_the_stitcher_spans_and_kernel_act_on(tmp_path, name, arg):
    """plan() derives each fact once, and the pipeline's parts take theirs from it."""
    from otel_gpu.config import Config
    from otel_gpu.wiring import build_pipeline
    p = sampling.plan(name, arg)
    assert (p.kernel_bound, p.parents, p.quiet_when_idle, p.deferred_bound, p.root_bound) == (
        sampling.kernel_bound(name, arg), sampling.parent_decides(name), sampling.drops_roots(name, arg),
        sampling.bound_once_parents_unsampled(name, arg), sampling.root_bound(name, arg))
    assert type(p.sampler) is type(sampling.make(name, arg))
    w = build_pipeline(Config(proc_root=str(tmp_path), traces_sampler=name, traces_sampler_arg=arg), Stats(),
                       metric_readers=[])
    assert dataclasses.replace(w.sampling, sampler=p.sampler) == p  # samplers compare by identity
    assert (w.stitcher.http._sampler, w.stitcher.http.kernel_bound, w.stitcher.s.quiet_when_idle,
            w.stitcher.http.root_bound) == (w.sampling.sampler, p.kernel_bound, p.quiet_when_idle, p.root_bound)


@pytest.mark.parametrize("name,arg", [("always_on", None), ("always_off", None), ("traceidratio", "0.1"),
                                      ("traceidratio", "1"), ("traceidratio", "0"),
                                      ("parentbased_always_on", None), ("parentbased_always_off", None),
                                      ("parentbased_traceidratio", "0.5"), ("parentbased_traceidratio", None)])
def test_a_root_is_decided_by_its_bound_as_the_sdk_sampler_decides_it(name, arg):
    """The stitcher decides roots by sampling.root_bound, not through the SDK: the same
    decision for ids on, beside and far from the bound, whatever the high 64 bits."""
    bound, sampler, rng = sampling.root_bound(name, arg), sampling.make(name, arg), random.Random(13)
    lows = [0, 1, (1 << 64) - 1] + [b for b in (bound - 1, bound, bound + 1) if 0 <= b < 1 << 64]
    lows += [rng.getrandbits(64) for _ in range(300)]
    for low in lows:
        trace_id = rng.getrandbits(64) << 64 | low or 1
        assert sampling.root_sampled(bound, trace_id) == sampling.sampled(sampler, trace_id, "GET", SpanKind.SERVER), \
            (name, low)


@pytest.mark.parametrize("name,arg", [("traceidratio", "0.1"), ("parentbased_traceidratio", "0.5"),
                                      ("always_off", None), ("parentbased_always_off", None),
                                      ("parentbased_always_on", None)])
def test_a_root_decides_as_the_kernel_did(name, arg):
    """A root request whose head the kernel drew for decides as the kernel did (draw <
    bound): the first of its read with the draw as its trace id's low bits, a pipelined
    next one with new bits on the same side; trace ids stay distinct. The kernel draws
    neither 0 nor 2^64 - 1 (bpf/head_sampling.c head_draw)."""
    bound = sampling.kernel_bound(name, arg)
    if bound is None:  # decided in the kernel once an unsampled parent is seen
        bound = sampling.bound_once_parents_unsampled(name, arg)
    rng, sampler = random.Random(7), sampling.make(name, arg)
    ids = set()
    draws = [1, bound - 1 if bound else 1, (1 << 64) - 2] + [rng.getrandbits(64) or 1 for _ in range(200)]
    if bound != sampling.ALL_ROOTS:  # the first draw not sampled (the kernel never draws ALL_ROOTS)
        draws.append(bound or 2)
    for draw in draws:
        for fresh in (True, False):
            trace_id = sampling.root_trace_id(rng, draw, fresh, bound)
            assert (trace_id & ((1 << 64) - 1) == draw) is fresh or trace_id & ((1 << 64) - 1) == draw
            assert sampling.sampled(sampler, trace_id, "GET", SpanKind.SERVER) == (draw < bound), (draw, fresh)
            ids.add(trace_id)
    assert len(ids) == 2 * len(draws)


def test_the_stitcher_takes_the_kernels_draw_for_roots_only():
    """A root's trace id ends in its connection's draw (SockIo.draw, on the read that starts
    the kernel's request), once; a request with a traceparent keeps its parent's trace."""
    from otel_gpu.pipeline.stitcher import Stitcher
    from tests.unit.pipeline.test_stitcher import OK, accept, get, read, write
    bound = sampling.kernel_bound("parentbased_traceidratio", "0.5")
    s = Stitcher(span_budget=8, rng=random.Random(3), sampler=sampling.make("parentbased_traceidratio", "0.5"),
                 kernel_bound=bound)
    tp = b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
    first, parent = read(get("/a") + get("/b"), fd=5, tid=5, pid=9), read(get("/c", tp), fd=6, tid=6, pid=9)
    first.req_start, first.draw = True, bound + 5  # unsampled by its draw
    parent.req_start, parent.draw = True, 3
    out = s.process([accept(fd=5, pid=9), accept(fd=6, pid=9), first, parent])
    out += s.process([write(OK, fd=5, tid=5, pid=9), write(OK, fd=5, tid=5, pid=9), write(OK, fd=6, tid=6, pid=9)])
    reqs = {r.head.path: r for r in out if hasattr(r, "sampled")}
    low = (1 << 64) - 1
    assert reqs["/a"].trace_id & low == bound + 5 and not reqs["/a"].sampled
    assert reqs["/b"].trace_id & low != bound + 5 and not reqs["/b"].sampled  # pipelined: the same side
    assert reqs["/c"].trace_id == 0x4bf92f3577b34da6a3ce929d0e0e4736 and reqs["/c"].sampled  # by its parent


def test_calls_streamed_for_an_unsampled_request_are_counted():
    """cuda_calls_streamed_unsampled: the calls that reached an unsampled request one by one
    (work the kernel could have counted: bench item 2's check of #26 item 1)."""
    from otel_gpu.pipeline.stitcher import Stitcher
    from tests.unit.pipeline.test_stitcher import OK, accept, cuda, get, read, write
    for name, expected in (("always_off", 2), ("always_on", 0)):
        stats = Stats()
        s = Stitcher(span_budget=8, rng=random.Random(3), sampler=sampling.make(name, None), stats=stats)
        s.process([accept(fd=5, pid=9), read(get("/a"), fd=5, tid=5, pid=9), cuda(tid=5, pid=9), cuda(tid=5, pid=9),
                   write(OK, fd=5, tid=5, pid=9)])
        assert stats.snapshot().get("cuda_calls_streamed_unsampled", 0) == expected, name
