"""CUDA graphs through the wired pipeline (otel_gpu/pipeline/graphs.py): launches on a
capturing stream are recorded, not run; graph launches name the captured kernels, in a
request and in rollups outside requests; bounded state."""
import pytest

from otel_gpu import semconv as sc
from otel_gpu.pipeline import graphs
from otel_gpu.pipeline.graphs import Graphs
from otel_gpu.records import (EV_SOCK_READ, EV_SOCK_WRITE, Accept, GraphOp, KernelRollup, LaunchCall, ProcExit,
                              SockIo, Tick)
from otel_gpu.cuda_calls import call_id
from tests.unit.pipeline.calls import cuda
from tests.unit.test_pipeline import OK, PID, wired

S, OTHER, GRAPH, EXEC = 0x5000, 0x6000, 0x7000, 0x8000
A, B, C = 0xA, 0xB, 0xC


def op(name, ts, stream=0, graph=0, exec_=0, ret=0):
    return GraphOp(PID, 1, ts, call_id(name), ret, stream, graph, exec_)


def captured(func, stream, ts):
    r = cuda(func=func, pid=PID, ts=ts, stream=stream)
    r.capture = True
    return r


def capture_events(ts=100):
    """Capture on S: A x3, B x1; C on another stream while capturing (it runs); instantiate."""
    evs = [op("cudaStreamBeginCapture", ts, stream=S)]
    evs += [captured(A, S, ts + 1 + i) for i in range(3)] + [captured(B, S, ts + 4), captured(C, OTHER, ts + 5)]
    evs += [op("cudaStreamEndCapture", ts + 6, stream=S, graph=GRAPH),
            op("cudaGraphInstantiate", ts + 7, graph=GRAPH, exec_=EXEC)]
    return evs


def request_with_graph_launches(ts=1000, fd=7, n=2):
    head = b"GET /infer/1 HTTP/1.1\r\n\r\n"
    evs = [Accept(PID, 1, ts, fd, 3, "127.0.0.1", 5000), SockIo(EV_SOCK_READ, PID, 1, ts + 1, fd, len(head), head, b"")]
    evs += [cuda("cudaGraphLaunch", func=EXEC, pid=PID, ts=ts + 2 + i, stream=S) for i in range(n)]
    return evs + [SockIo(EV_SOCK_WRITE, PID, 1, ts + 20, fd, len(OK), OK, OK[-8:])]


def test_a_request_names_what_its_graph_launches_ran(tmp_path):
    w, spans, _ = wired(tmp_path)
    w.pipeline.push(capture_events() + request_with_graph_launches() + [Tick(10_000, final=True)])
    finished = spans.get_finished_spans()
    (server,) = [s for s in finished if s.kind.name == "SERVER"]
    kids = [s for s in finished if s.parent and s.parent.span_id == server.context.span_id]
    assert [k.name for k in kids] == ["cudaGraphLaunch", "cudaGraphLaunch"]
    for k in kids:
        assert list(k.attributes[sc.GPU_GRAPH_KERNELS]) == ["ka", "kb"]  # first-launch order
        assert list(k.attributes[sc.GPU_GRAPH_KERNEL_COUNTS]) == [3, 1]
        assert k.attributes[sc.GPU_GRAPH_KERNEL_NODES] == 4
    assert server.attributes[sc.GPU_LAUNCHES] == 2  # the two graph launches
    assert server.attributes[sc.GPU_GRAPH_KERNEL_LAUNCHES] == 8
    assert server.attributes[sc.GPU_DISTINCT_KERNELS] == 2
    # The captured launches ran nowhere; C (another stream) ran, outside the request.
    (outside,) = [s for s in finished if s.name == "GPU work outside requests"]
    assert outside.attributes[sc.GPU_LAUNCHES] == 1
    outside_kids = [s for s in finished if s.parent and s.parent.span_id == outside.context.span_id]
    assert [k.attributes[sc.GPU_KERNEL_NAME] for k in outside_kids] == ["kc"]
    graph_stage = w.pipeline.stages[0]
    assert graph_stage.state()["graph_launches_captured"] == 4
    assert graph_stage.state()["graph_launches_named"] == 2


def test_graph_launches_counted_in_the_kernel_are_named_too(tmp_path):
    w, spans, _ = wired(tmp_path)
    w.pipeline.push(capture_events() + [KernelRollup(PID, call_id("cudaGraphLaunch"), EXEC, 5, 0, 0, 5_000, None),
                                        Tick(6_000, final=True)])
    finished = spans.get_finished_spans()
    (outside,) = [s for s in finished if s.name == "GPU work outside requests"]
    assert outside.attributes[sc.GPU_LAUNCHES] == 6  # 5 graph launches + C
    assert outside.attributes[sc.GPU_GRAPH_KERNEL_LAUNCHES] == 20
    (rollup,) = [s for s in finished if s.attributes.get(sc.GPU_ROLLUP_COUNT) == 5]
    assert list(rollup.attributes[sc.GPU_GRAPH_KERNELS]) == ["ka", "kb"]
    assert list(rollup.attributes[sc.GPU_GRAPH_KERNEL_COUNTS]) == [3, 1]


def test_a_flagged_launch_on_a_stream_not_capturing_runs():
    g = Graphs()
    out = g.process([op("cudaStreamBeginCapture", 1, stream=S), captured(A, OTHER, 2)])
    assert [type(r) for r in out] == [LaunchCall]
    # The capture ended: a later flagged launch on S (a stale flag) runs too.
    out = g.process([op("cudaStreamEndCapture", 3, stream=S, graph=GRAPH), captured(A, S, 4)])
    assert [type(r) for r in out] == [LaunchCall]


def test_runtime_and_driver_records_of_one_capture_make_one_graph():
    g = Graphs()
    g.process([op("cudaStreamBeginCapture", 1, stream=S), op("cuStreamBeginCapture", 2, stream=S),
               captured(A, S, 3),
               op("cuStreamEndCapture", 4, stream=S, graph=GRAPH), op("cudaStreamEndCapture", 5, stream=S, graph=GRAPH),
               op("cuGraphInstantiate", 6, graph=GRAPH, exec_=EXEC), op("cudaGraphInstantiate", 7, graph=GRAPH, exec_=EXEC)])
    launch = cuda("cudaGraphLaunch", func=EXEC, pid=PID)
    g.process([launch])
    assert launch.kernels == ((A, 1),)


def test_a_failed_capture_is_no_graph_and_an_unknown_exec_is_counted():
    g = Graphs()
    g.process([op("cudaStreamBeginCapture", 1, stream=S), captured(A, S, 2),
               op("cudaStreamEndCapture", 3, stream=S, graph=0, ret=901),
               op("cudaGraphInstantiate", 4, graph=GRAPH, exec_=EXEC)])
    launch = cuda("cudaGraphLaunch", func=EXEC, pid=PID)
    g.process([launch])
    assert launch.kernels is None
    assert g.state()["graph_captures_dropped"] == 1 and g.state()["graph_launches_unknown"] == 1


def test_destroyed_execs_go_after_two_flushes_and_exits_forget_everything():
    g = Graphs()
    g.process(capture_events())
    g.process([op("cudaGraphExecDestroy", 200, exec_=EXEC), Tick(300)])
    late = cuda("cudaGraphLaunch", func=EXEC, pid=PID)
    g.process([late])  # a rollup of its last launches may still come: still known
    assert late.kernels == ((A, 3), (B, 1))
    g.process([Tick(400)])
    gone = cuda("cudaGraphLaunch", func=EXEC, pid=PID)
    g.process([gone])
    assert gone.kernels is None
    g.process([ProcExit(PID, 500)])
    assert PID not in g.procs


def test_state_per_process_is_bounded(monkeypatch):
    monkeypatch.setattr(graphs, "MAX_PER_PROCESS", 4)
    g = Graphs()
    for i in range(10):
        g.process([op("cudaStreamBeginCapture", 1, stream=S), captured(A, S, 2),
                   op("cudaStreamEndCapture", 3, stream=S, graph=GRAPH + i),
                   op("cudaGraphInstantiate", 4, graph=GRAPH + i, exec_=EXEC + i)])
    p = g.procs[PID]
    assert len(p.graphs) == 4 and len(p.execs) == 4
    assert g.state()["graphs_evicted"] == 12  # 6 graphs and 6 execs


def test_decode_reads_graph_ops_and_the_capture_flag():
    import ctypes as ct

    from otel_gpu.kernel_io import abi, decode
    e = abi.GraphOpEvent()
    e.c.h.kind, e.c.h.tgid, e.c.call, e.c.ret = abi.EV_GRAPH_OP, PID, call_id("cuStreamEndCapture"), 0
    e.stream, e.graph = S, GRAPH
    r = decode.decode(bytes(e))
    assert (type(r), r.call, r.stream, r.graph, r.graph_exec) == (GraphOp, e.c.call, S, GRAPH, 0)
    with pytest.raises(decode.DecodeError):
        decode.decode(bytes(e)[:-1])
    launch = abi.LaunchEvent()
    launch.c.h.kind, launch.c.h.flags, launch.func = abi.EV_CUDA_LAUNCH, abi.EV_FLAG_CAPTURE, A
    r = decode.decode(bytes(launch))
    assert r.capture and not r.unreadable
    launch.c.h.flags = abi.EV_FLAG_UNREADABLE
    r = decode.decode(bytes(launch))
    assert r.unreadable and not r.capture
    assert ct.sizeof(abi.GraphOpEvent) == decode.GRAPH_OP.size


def test_a_rollup_read_before_its_graph_ops_waits_for_the_next_batch():
    """The kernel's counts are read after a poll: the capture's records may be behind them."""
    g = Graphs()
    rollup = KernelRollup(PID, call_id("cudaGraphLaunch"), EXEC, 5, 0, 0, 5_000, None)
    assert g.process([rollup, Tick(5_000)]) == [Tick(5_000)]
    out = g.process(capture_events())
    assert out[0] is rollup and rollup.kernels == ((A, 3), (B, 1))
    assert [type(r) for r in out[1:]] == [LaunchCall]  # C ran; the rest were consumed
    # Still unknown after one batch: it goes on unnamed, counted; a final Tick never strands one.
    other = KernelRollup(PID, call_id("cudaGraphLaunch"), EXEC + 1, 1, 0, 0, 6_000, None)
    g.process([other])
    assert g.process([Tick(7_000, final=True)]) == [other, Tick(7_000, final=True)]
    assert other.kernels is None and g.state()["graph_launches_unknown"] == 1
