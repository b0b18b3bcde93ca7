"""Trace sampling by the OpenTelemetry conventions: OTEL_TRACES_SAMPLER (always_on,
always_off, traceidratio, parentbased_always_on, parentbased_always_off,
parentbased_traceidratio; default parentbased_always_on) and OTEL_TRACES_SAMPLER_ARG (the
ratio, 0..1, default 1). The SDK's samplers decide; a request's parent is its incoming
traceparent (its sampled flag). A window linked to a sampled request goes out with it,
others are sampled as their own roots. A request is decided as it opens; a window as its
span is built. The decision only sets the spans' sampled flag: OTLP sends sampled traces
alone, while metrics, cost, the local store and `otel-gpu report` see every request
(export/destinations.py).

An unsampled request's CUDA calls are counted in the kernel, not streamed one by one.
With a ratio sampler the kernel decides each request itself as its head is read
(bpf/head_sampling.c): for a root it draws the trace id's low 64 bits, which is all
TraceIdRatioBased looks at (root_trace_id makes them the trace id), and a canonical
traceparent decides by its flag (parent_decides) or its trace id; the calls of the unit
that read an unsampled head, and of Python contexts copied from it, are then counted. A
parent-based sampler that samples every root (the default) has the kernel decide once an
unsampled parent is seen (bound_once_parents_unsampled). Requests it cannot decide
(another form of traceparent, a head not whole in its reads, HTTP/2, TLS) are the
collector's: while a process has no sampled request open the kernel counts its calls
(bpf/maps.h quiet_procs, pipeline/stitcher.py)."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from opentelemetry.sdk.trace.sampling import (ALWAYS_OFF, ALWAYS_ON, Decision, ParentBased,
                                              ParentBasedTraceIdRatio, Sampler, TraceIdRatioBased)
from opentelemetry.trace import NonRecordingSpan, SpanContext, SpanKind, TraceFlags, set_span_in_context

from ..config import sampler_ratio

LOW_BITS = 1 << 64  # TraceIdRatioBased compares a trace id's low 64 bits with its bound
ALL_ROOTS = LOW_BITS - 1  # a bound every kernel draw is below (bpf/head_sampling.c never draws it)


@dataclass(frozen=True)
class SamplingPlan:
    """What the configured sampler means for each part that acts on it, derived once
    (plan()): the stitcher, the span builder and the collector's kernel settings."""
    sampler: Sampler
    kernel_bound: Optional[int]    # the kernel decides roots against it from the start (kernel_bound)
    parents: bool                  # an incoming traceparent's flag decides (parent_decides)
    quiet_when_idle: bool          # a process with no sampled request open is quiet when idle (drops_roots)
    deferred_bound: Optional[int]  # the kernel decides from the first unsampled parent on
                                   # (bound_once_parents_unsampled)
    root_bound: int                # what the sampler decides for a root (root_bound)


def plan(name: str, arg: Optional[str]) -> SamplingPlan:
    """The plan for OTEL_TRACES_SAMPLER `name` with OTEL_TRACES_SAMPLER_ARG `arg`
    (ValueError as make())."""
    return SamplingPlan(make(name, arg), kernel_bound(name, arg), parent_decides(name), drops_roots(name, arg),
                        bound_once_parents_unsampled(name, arg), root_bound(name, arg))


def make(name: str, arg: Optional[str]) -> Sampler:
    """The sampler named (config.SAMPLERS); ValueError for an unknown name or a ratio
    outside 0..1."""
    ratio = sampler_ratio(name, arg)
    samplers = {"always_on": lambda: ALWAYS_ON, "always_off": lambda: ALWAYS_OFF,
                "traceidratio": lambda: TraceIdRatioBased(ratio),
                "parentbased_always_on": lambda: ParentBased(ALWAYS_ON),
                "parentbased_always_off": lambda: ParentBased(ALWAYS_OFF),
                "parentbased_traceidratio": lambda: ParentBasedTraceIdRatio(ratio)}
    return samplers[name]()


def drops_roots(name: str, arg: Optional[str]) -> bool:
    """Does the sampler drop traces that start here (no parent)? Then a process with no
    sampled request open is quiet even when idle: the next request is more likely unsampled,
    and a sampled one has its first calls (before the collector reads its head) counted, not
    streamed one by one. The samplers the kernel decides roots for, exactly."""
    return kernel_bound(name, arg) is not None


def kernel_bound(name: str, arg: Optional[str]) -> Optional[int]:
    """The bound the kernel samples root requests by (sampled when their draw is below
    it: bpf/head_sampling.c), or None where it decides none: a sampler that samples
    every root (always_on, parentbased_always_on, a ratio of 1) leaves nothing to count."""
    if name in ("always_off", "parentbased_always_off"):
        return 0
    bound = TraceIdRatioBased.get_bound_for_rate(sampler_ratio(name, arg))
    return bound if name.endswith("traceidratio") and bound < LOW_BITS else None


def root_bound(name: str, arg: Optional[str]) -> int:
    """The sampler's decision for a root (no traceparent), as TraceIdRatioBased makes it:
    sampled when the trace id's low 64 bits are below this (LOW_BITS: every root, 0: none).
    The stitcher decides roots by it (root_sampled) without the SDK's per-call objects
    (~7 µs a request); a unit test holds it equal to the SDK's samplers."""
    if name in ("always_on", "parentbased_always_on"):
        return LOW_BITS
    if name in ("always_off", "parentbased_always_off"):
        return 0
    return TraceIdRatioBased.get_bound_for_rate(sampler_ratio(name, arg))


def root_sampled(bound: int, trace_id: int) -> bool:
    return trace_id & ALL_ROOTS < bound


def bound_once_parents_unsampled(name: str, arg: Optional[str]) -> Optional[int]:
    """A parent-based sampler that samples every root (parentbased_always_on, the default,
    or parentbased_traceidratio at 1) leaves the kernel nothing to decide for roots, but a
    parent's flag still decides: a service behind a sampling gateway gets most requests
    with an unsampled parent. The kernel decides by ALL_ROOTS (every root sampled, each
    canonical parent by its flag) once the collector has seen such a parent; None for the
    other samplers (kernel_bound decides for them from the start, or nothing is to decide)."""
    return ALL_ROOTS if kernel_bound(name, arg) is None and parent_decides(name) else None


def parent_decides(name: str) -> bool:
    """Does an incoming traceparent's sampled flag decide (the parent-based samplers), or
    its trace id, as a root's (bpf/head_sampling.c head_settings.parents)?"""
    return name.startswith("parentbased_")


def root_trace_id(rng, draw: int, fresh: bool, bound: Optional[int]) -> int:
    """A root request's trace id where the kernel drew for it (`draw`, non-zero): the
    draw as its low 64 bits for the first request of the kernel's read (`fresh`); a
    request pipelined after it in the same read takes new bits on the same side of the
    bound, since the kernel decided for the read's unit once."""
    low = draw
    if not fresh and bound is not None:
        low = rng.randrange(bound) if draw < bound else rng.randrange(bound, LOW_BITS)
    return rng.getrandbits(64) << 64 | low or 1


def sampled(sampler: Sampler, trace_id: int, name: str, kind: SpanKind,
            parent_span_id: Optional[int] = None, parent_sampled: Optional[bool] = None) -> bool:
    """Does the trace go out? `parent_*`: the incoming traceparent, if any."""
    context = None
    if parent_span_id:
        flags = TraceFlags(TraceFlags.SAMPLED if parent_sampled else TraceFlags.DEFAULT)
        parent = SpanContext(trace_id, parent_span_id, is_remote=True, trace_flags=flags)
        context = set_span_in_context(NonRecordingSpan(parent))
    result = sampler.should_sample(context, trace_id, name, kind)
    return result.decision is Decision.RECORD_AND_SAMPLE
