"""Cost adds up: requests, ambiguous and outside windows of one process on one device,
through the real CostStage, SpanBuilder and StoreExporter, then `report`: exact +
split + outside over the rows equals the union of the process's busy time."""
import json
import random

import pytest
from opentelemetry.sdk.resources import Resource

from otel_gpu import semconv as sc
from otel_gpu.clock import BpfClock
from otel_gpu.export.spans import SpanBuilder
from otel_gpu.pipeline.cost import CostStage, Prices
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.model import CallSink, ProcessWindow, Request
from otel_gpu.records import RequestOpened, Tick
from otel_gpu.cuda_calls import call_id
from otel_gpu.store.report import build_report
from store_helpers import run_cli
from tests.unit.pipeline.calls import cuda

PID = 77
MS = 1_000_000
BASE = 10**12  # BPF monotonic ns of the test's time 0


def t(ms):
    return BASE + int(ms * MS)


def busy_calls(start_ms, end_ms):
    """A launch at start and a sync ending at end: busy start..end by the model's rule."""
    return [cuda(ts=t(start_ms), ret=-1), cuda("cudaDeviceSynchronize", ts=t(end_ms - 1), duration=MS, ret=-1)]


def request(n, path, open_ms, busy_ms=None):
    r = Request(PID, 1, 3, RequestHead("GET", path, "1.1", {}), t(open_ms[0]), trace_id=0x100 + n, span_id=n,
                sink=CallSink(8), end_ns=t(open_ms[1]), status=200)
    for c in busy_calls(*busy_ms) if busy_ms else ():
        r.sink.add(c, "thread")
        r.busy.add(c, 0)
    return r


def window(attribution, calls, candidates=(), budget=8):
    sink = CallSink(budget)
    for c in calls:
        sink.add(c, attribution)
    return ProcessWindow(PID, attribution, calls[0].ts_ns, calls[-1].ts_ns, sink,
                         candidates=[(r.trace_id, r.span_id) for r in candidates])


def enrich(records):
    for r in records:
        if isinstance(r, (Request, ProcessWindow)):
            r.resource = Resource({sc.SERVICE_NAME: "svc", sc.PROCESS_PID: PID})
            if isinstance(r, Request):
                r.route = r.head.path
    return records


@pytest.fixture
def pipeline(store):
    cost = CostStage(Prices("3.6", model=""), clock=lambda: 0.0)
    builder = SpanBuilder(BpfClock(), ids=random.Random(5))
    released = []

    def push(records):
        for r in cost.process(enrich(records)):
            released.append(r)
            spans = builder.build(r)
            if spans:
                store.export(spans)
    push.released = released
    return push


def test_exact_split_and_outside_add_up_to_the_busy_time(pipeline, reader, db):
    a = request(1, "/infer", (0, 120), busy_ms=(0, 100))
    b = request(2, "/embed", (40, 160), busy_ms=(50, 150))
    c = request(3, "/infer", (100, 260))                    # no calls of its own
    d = request(4, "/embed", (150, 320), busy_ms=(250, 300))
    # Ambiguous 120..200 (its budget of 2 spent: the launch at 170 is a rollup) with
    # candidates b, c, d; outside 180..260, calls counted in the kernel at 230 included.
    amb = window("ambiguous", [cuda(ts=t(120), ret=-1), cuda(ts=t(140), ret=-1), cuda(ts=t(170), ret=-1),
                               cuda("cudaDeviceSynchronize", ts=t(190), duration=10 * MS, ret=-1)],
                 candidates=[b, c, d], budget=2)
    outside = window("outside", busy_calls(180, 260))
    outside.sink.add_aggregate(call_id("cudaLaunchKernel"), 0, 5, 0, 0, t(230), "outside")
    pipeline([RequestOpened(a), RequestOpened(b), a, b, c, RequestOpened(d), amb, outside, Tick(t(205))])
    assert amb not in pipeline.released and outside not in pipeline.released  # d is still open
    amb2 = window("ambiguous", busy_calls(310, 330), candidates=[d])  # the next flush
    pipeline([d, amb2, Tick(t(400)), Tick(t(401), final=True)])
    assert {id(r) for r in pipeline.released if isinstance(r, (Request, ProcessWindow))} == \
        {id(r) for r in (a, b, c, d, amb, outside, amb2)}

    # Union of busy time: [0, 300] + [310, 330] ms.
    union = 0.320
    assert a.gpu_seconds + b.gpu_seconds + d.gpu_seconds == pytest.approx(0.200)
    # amb: 150..180 alone, 180..200 shared with outside; outside: 180..250 (250.. is d's).
    assert amb.gpu_seconds == pytest.approx(0.040) and outside.gpu_seconds == pytest.approx(0.060)
    assert amb2.gpu_seconds == pytest.approx(0.020)
    # Split by how long each candidate was open during 120..200: b 40, c 80, d 50 ms.
    assert amb.split == pytest.approx({(0x102, 2): 0.040 * 40 / 170, (0x103, 3): 0.040 * 80 / 170,
                                       (0x104, 4): 0.040 * 50 / 170})

    rep = build_report(reader())
    rows = {r["feature"]: r for r in rep["rows"]}
    assert set(rows) == {"/infer", "/embed", None}
    assert sum(r["gpu_seconds"] for r in rep["rows"]) == pytest.approx(union)
    assert rep["totals"]["gpu_seconds"] == pytest.approx(union)
    assert rep["totals"]["exact_gpu_seconds"] + rep["totals"]["split_gpu_seconds"] + \
        rep["totals"]["outside_gpu_seconds"] == pytest.approx(union)
    assert rows["/infer"]["exact_gpu_seconds"] == pytest.approx(a.gpu_seconds)
    assert rows["/infer"]["split_gpu_seconds"] == pytest.approx(amb.split[(0x103, 3)])
    assert rows["/embed"]["exact_gpu_seconds"] == pytest.approx(b.gpu_seconds + d.gpu_seconds)
    assert rows["/embed"]["split_gpu_seconds"] == pytest.approx(
        amb.split[(0x102, 2)] + amb.split[(0x104, 4)] + 0.020)
    assert rows[None]["outside_gpu_seconds"] == pytest.approx(0.060) and rows[None]["requests"] == 0
    assert rep["totals"]["cost"] == pytest.approx(union * 3.6 / 3600)
    assert rep["totals"]["requests"] == 4

    code, out = run_cli("report", "--db", db, "--format", "json")
    assert code == 0 and json.loads(out)["totals"]["gpu_seconds"] == pytest.approx(union)
    code, out = run_cli("report", "--db", db)
    assert code == 0 and "(outside)" in out


def test_window_span_carries_its_split_aligned_with_its_links():
    amb = window("ambiguous", busy_calls(0, 10), candidates=[request(1, "/a", (0, 10)), request(2, "/b", (5, 10))])
    amb.gpu_seconds, amb.cost = 0.01, 0.02
    amb.split = {(0x101, 1): 0.006, (0x102, 2): 0.004}
    amb.split_features = {(0x101, 1): "/a"}  # (0x102, 2) never seen finishing
    span = SpanBuilder(BpfClock(), ids=random.Random(1), currency="EUR").build(amb)[0]
    a = span.attributes
    assert [(link.context.trace_id, link.context.span_id) for link in span.links] == [(0x101, 1), (0x102, 2)]
    assert list(a[sc.GPU_COST_SPLIT_SECONDS]) == [0.006, 0.004]
    assert list(a[sc.GPU_COST_SPLIT_FEATURES]) == ["/a", "(unknown)"]
    assert (a[sc.GPU_COST_SECONDS], a[sc.GPU_COST_AMOUNT], a[sc.GPU_COST_CURRENCY]) == (0.01, 0.02, "EUR")
    assert a[sc.GPU_COST_SOURCE] == "host_window"  # where the seconds came from (no device clock yet)
    bare = SpanBuilder(BpfClock()).build(window("outside", busy_calls(0, 10)))[0]
    assert sc.GPU_COST_SECONDS not in bare.attributes and sc.GPU_COST_SOURCE not in bare.attributes


def test_a_window_past_the_link_limit_links_its_largest_shares_and_keeps_the_rest_by_feature(store, reader):
    """A busy process's ambiguous window with 300 candidates: its span links the 128 with
    the largest shares (OTEL_SPAN_LINK_COUNT_LIMIT's default), says 172 were dropped, and
    keeps their shares summed by feature, so the store's cost by feature stays exact."""
    cands = [request(n, "/a" if n % 3 else "/b", (0, 10)) for n in range(1, 301)]
    amb = window("ambiguous", busy_calls(0, 10), candidates=cands)
    amb.gpu_seconds, amb.cost = 3.0, 6.0
    amb.split = {(r.trace_id, r.span_id): 3.0 * r.span_id / 45150 for r in cands}  # n / sum(1..300)
    amb.split_features = {(r.trace_id, r.span_id): r.head.path for r in cands if r.span_id != 7}  # 7: unknown
    enrich([amb])
    spans = SpanBuilder(BpfClock(), ids=random.Random(1)).build(amb)
    span, a = spans[0], spans[0].attributes
    assert [link.context.span_id for link in span.links] == list(range(173, 301))  # the largest, in order
    assert span.dropped_links == 172 and a[sc.GPU_CANDIDATE_REQUESTS] == 300
    assert list(a[sc.GPU_COST_SPLIT_SECONDS]) == [amb.split[(0x100 + n, n)] for n in range(173, 301)]
    rest = dict(zip(a[sc.GPU_COST_SPLIT_REST_FEATURES], a[sc.GPU_COST_SPLIT_REST_SECONDS]))
    by_feature = {"/a": 0.0, "/b": 0.0, "(unknown)": 0.0}
    for n in range(1, 173):
        by_feature["(unknown)" if n == 7 else "/a" if n % 3 else "/b"] += 3.0 * n / 45150
    assert rest == pytest.approx(by_feature)
    assert sum(a[sc.GPU_COST_SPLIT_SECONDS]) + sum(rest.values()) == pytest.approx(3.0)

    store.export(spans)
    rows = {r["feature"]: r for r in build_report(reader())["rows"]}
    for feature in ("/a", "/b"):
        assert rows[feature]["split_gpu_seconds"] == pytest.approx(
            sum(3.0 * n / 45150 for n in range(1, 301) if n != 7 and (feature == "/a") == bool(n % 3)))
    assert sum(r["split_gpu_seconds"] for r in rows.values()) == pytest.approx(3.0)
    assert sum(r["cost"] for r in rows.values()) == pytest.approx(6.0)


def test_shared_windows_of_a_worker_add_up_with_the_front_ends_requests(pipeline, reader):
    """A front-end (PID) whose requests make no CUDA calls, and a worker process that
    does the work in batch steps (shared windows linked to the requests in flight) and
    some work of its own (outside): the worker's busy time is all there, split among
    the front-end's features."""
    worker = PID + 1
    a = request(1, "/gen", (0, 100))
    b = request(2, "/embed", (20, 180))
    c = request(3, "/gen", (110, 260))

    def step(start_ms, end_ms, candidates):
        w = window("shared", busy_calls(start_ms, end_ms), candidates=candidates)
        w.tgid = worker
        return w

    s1, s2, s3 = step(10, 60, [a, b]), step(60, 90, [a, b]), step(120, 200, [b, c])
    own = window("outside", busy_calls(280, 300))
    own.tgid = worker
    pipeline([RequestOpened(a), RequestOpened(b), s1, s2, a, RequestOpened(c), s3, b, c, own,
              Tick(t(400)), Tick(t(401), final=True)])
    assert {id(r) for r in pipeline.released if isinstance(r, (Request, ProcessWindow))} == \
        {id(r) for r in (a, b, c, s1, s2, s3, own)}
    assert a.gpu_seconds == b.gpu_seconds == c.gpu_seconds == 0.0
    for w in (s1, s2, s3):
        assert sum(w.split.values()) == pytest.approx(w.gpu_seconds)
    assert [w.gpu_seconds for w in (s1, s2, s3, own)] == pytest.approx([0.050, 0.030, 0.080, 0.020])
    # s3 (120..200): b open 60 ms of it, c 80 ms.
    assert s3.split == pytest.approx({(0x102, 2): 0.080 * 60 / 140, (0x103, 3): 0.080 * 80 / 140})

    rep = build_report(reader())
    rows = {r["feature"]: r for r in rep["rows"]}
    union = 0.050 + 0.030 + 0.080 + 0.020
    assert rep["totals"]["gpu_seconds"] == pytest.approx(union)
    assert rep["totals"]["exact_gpu_seconds"] == 0.0
    assert rep["totals"]["split_gpu_seconds"] == pytest.approx(union - 0.020)
    assert rows[None]["outside_gpu_seconds"] == pytest.approx(0.020)
    assert rows["/embed"]["split_gpu_seconds"] == pytest.approx(
        s1.split[(0x102, 2)] + s2.split[(0x102, 2)] + s3.split[(0x102, 2)])
    assert rows["/gen"]["requests"] == 2 and rows["/gen"]["split_gpu_seconds"] == pytest.approx(
        s1.split[(0x101, 1)] + s2.split[(0x101, 1)] + s3.split[(0x103, 3)])
