"""Kernel and graph launch metrics (otel_gpu/export/metrics.py) through the wired pipeline:
gpu.cuda.kernel.launch.calls counts launch calls by kernel, gpu.cuda.graph.launch.calls
graph launches (as OBI names them), and otel_gpu.graph.kernel.launches each kernel a graph
ran (graph launches x the capture's counts), in requests and outside them; graph kernels'
names are bounded like any."""
from otel_gpu import semconv as sc
from otel_gpu.export import metrics
from otel_gpu.records import KernelRollup, Tick
from otel_gpu.cuda_calls import call_id
from tests.unit.pipeline.test_graphs import EXEC, capture_events, request_with_graph_launches
from tests.unit.test_pipeline import PID, _points, wired

ROUTE, SVC = (sc.HTTP_ROUTE, "/infer/{id}"), (sc.SERVICE_NAME, "svc")
DEVICE = (sc.CUDA_DEVICE_INDEX, 0)  # a request's device: the stitcher's 0 before any cudaSetDevice


def _key(*labels):
    return tuple(sorted(labels))


def test_graph_launches_count_the_kernels_they_ran_by_name(tmp_path):
    w, _, reader = wired(tmp_path)
    # Capture A x3, B x1 on S (C ran on another stream), two graph launches in a request,
    # then 5 replays counted in the kernel outside requests.
    w.pipeline.push(capture_events() + request_with_graph_launches(n=2)
                    + [KernelRollup(PID, call_id("cudaGraphLaunch"), EXEC, 5, 0, 0, 5_000, None),
                       Tick(6_000, final=True)])
    ran = _points(reader, "otel_gpu.graph.kernel.launches")
    kernel = lambda name: (sc.GPU_KERNEL_NAME, name)  # noqa: E731
    assert ran[_key(ROUTE, SVC, DEVICE, kernel("ka"))] == 2 * 3
    assert ran[_key(ROUTE, SVC, DEVICE, kernel("kb"))] == 2 * 1
    assert ran[_key(SVC, kernel("ka"))] == 5 * 3  # outside requests
    assert ran[_key(SVC, kernel("kb"))] == 5 * 1
    assert sum(ran.values()) == 8 + 20  # the 4 recorded launches ran nowhere
    assert _points(reader, "gpu.cuda.graph.launch.calls") == {_key(ROUTE, SVC, DEVICE): 2, _key(SVC): 5}
    assert _points(reader, "gpu.cuda.kernel.launch.calls") == {_key(SVC, kernel("kc")): 1}  # beside the capture


def test_graph_kernel_names_share_the_name_bound(tmp_path):
    w, _, reader = wired(tmp_path)
    gm = next(s for s in w.pipeline.stages if isinstance(s, metrics.GpuMetrics))
    gm.top_kernels = 1  # the first name seen keeps its series; ka, kb, kc: two fold into "other"
    w.pipeline.push(capture_events() + request_with_graph_launches(n=1) + [Tick(6_000, final=True)])
    launches = _points(reader, "otel_gpu.graph.kernel.launches")
    names = {dict(k)[sc.GPU_KERNEL_NAME] for k in launches} | \
        {dict(k)[sc.GPU_KERNEL_NAME] for k in _points(reader, "gpu.cuda.kernel.launch.calls")}
    assert len(names) == 2 and metrics.OTHER in names, names
    assert sum(launches.values()) == 3 + 1


def test_response_chunks_are_counted_by_feature(tmp_path):
    """otel_gpu.response.chunks: a streamed response's body writes (an SSE token each), by
    feature, beside otel_gpu.cost.* for cost per token."""
    from otel_gpu.records import EV_SOCK_WRITE, SockIo
    from tests.unit.test_pipeline import request_events
    w, _, reader = wired(tmp_path)
    head = b"HTTP/1.1 200 OK\r\nTransfer-Encoding: chunked\r\n\r\n"
    evs = request_events(launches=1)[:-1]  # its answer, streamed instead:
    evs += [SockIo(EV_SOCK_WRITE, PID, 1, 2000 + i, 7, len(raw), raw, raw[-8:])
            for i, raw in enumerate([head, b"4\r\ndata\r\n", b"4\r\ndata\r\n", b"0\r\n\r\n"])]
    w.pipeline.push(evs + [Tick(6_000, final=True)])
    chunks = _points(reader, "otel_gpu.response.chunks")
    assert chunks == {_key(SVC, (sc.GPU_FEATURE, "/infer/{id}")): 3}  # two chunks and the terminator


def test_a_request_leaves_as_it_finishes_and_its_cost_follows(tmp_path):
    """Under overlapping traffic a finished request's GPU time may be shared with one still
    open: its span and its request and call metrics leave at once, its cost once settled."""
    from tests.unit.test_pipeline import request_events
    w, spans, reader = wired(tmp_path)
    a = request_events(ts=1000, fd=7, tid=1, launches=2)
    b = request_events(ts=1005, fd=8, tid=2, launches=2)
    w.pipeline.push(a[:2] + b[:2] + a[2:] + b[2:4])  # a answered while b is open and busy
    (span,) = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]  # a, out already
    assert span.attributes["otel_gpu.cost.pending"] is True and "otel_gpu.cost.gpu_seconds" not in span.attributes
    assert "otel_gpu.cost.source" not in span.attributes  # no figure, no source
    http = _points(reader, "http.server.request.duration")
    assert sum(http.values()) == 1  # a, counted already
    assert _points(reader, "otel_gpu.cost.gpu_seconds") == {}  # its cost: once settled
    w.pipeline.push(b[4:] + [Tick(20_000, final=True)])
    assert sum(_points(reader, "http.server.request.duration").values()) == 2
    assert _points(reader, "otel_gpu.cost.gpu_seconds")  # settled now
    servers = [s for s in spans.get_finished_spans() if s.kind.name == "SERVER"]
    assert len(servers) == 2
    assert servers[1].attributes["otel_gpu.cost.source"] == "host_window"  # b's, settled at its end
