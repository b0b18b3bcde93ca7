"""NCCL calls from record to span, summary and metric: the decoder, the names of the
codes (and the C side's datatype sizes), the span attributes, the request summary, the
bounded metric by op, and discovery of libnccl files."""
import re
from pathlib import Path

import pytest
from opentelemetry.sdk.metrics.export import InMemoryMetricReader

from otel_gpu import semconv as sc
from otel_gpu.export.metrics import GpuMetrics
from otel_gpu.export.call_attributes import call_attributes, summary_attributes
from otel_gpu.kernel_io import decode
from otel_gpu.kernel_io.abi import EV_FLAG_UNREADABLE, EV_NCCL, NCCL_NO_OP
from otel_gpu.pipeline.model import CallSink, ProcessWindow
from otel_gpu.records import NcclCall
from otel_gpu.probes import nccl
from otel_gpu.probes.discovery import libraries_in_maps
from otel_gpu.cuda_calls import NCCL, call_id

NCCL_C = Path(__file__).resolve().parents[3] / "bpf" / "nccl_probes.c"


def call(name="ncclAllReduce", count=10, nbytes=40, datatype=7, redop=0, peer=-1, comm=0xC0, nranks=4, rank=1,
         stream=0x50, group=0, unreadable=False):
    return NcclCall(9, 10, 1_000, call_id(name), -1, count, nbytes, datatype, redop, peer, comm, nranks, rank,
                    stream, group, unreadable=unreadable)


def test_the_bpf_side_sizes_every_datatype_as_nccl_h():
    sizes = {int(t): int(n) for t, n in re.findall(r"case (\d+): return (\d+);", NCCL_C.read_text())}
    assert sizes == {code: size for code, (_, size) in nccl.DATATYPES.items()}


def test_decode_round_trip_and_bad_length():
    raw = decode.NCCL.pack(EV_NCCL, EV_FLAG_UNREADABLE, 9, 10, 1_000, call_id("ncclReduce"), -1, 0xABC,
                           5, 40, 0xC0, 0x50, 0x77, 8, 4, 2, 4, 1)
    c = decode.decode(raw)
    assert isinstance(c, NcclCall) and c.unreadable and c.ctx == 0xABC
    assert (c.count, c.bytes, c.comm, c.stream, c.group, c.datatype, c.redop, c.peer, c.nranks, c.rank) == \
        (5, 40, 0xC0, 0x50, 0x77, 8, 4, 2, 4, 1)
    assert c.amounts() == (0xC0, 40, 0)  # rolled up by communicator, bytes added up
    with pytest.raises(decode.DecodeError):
        decode.decode(raw[:-8])


def test_span_attributes_of_a_reduction_with_a_root_in_a_group():
    a = call_attributes(call("ncclReduce", redop=4, peer=2, group=0x1F), {})
    assert {k: v for k, v in a.items() if k.startswith("gpu.nccl") or k == sc.GPU_STREAM} == {
        sc.GPU_NCCL_OP: "reduce", sc.GPU_NCCL_COUNT: 10, sc.GPU_NCCL_BYTES: 40, sc.GPU_NCCL_DATATYPE: "float32",
        sc.GPU_NCCL_REDUCTION: "avg", sc.GPU_NCCL_ROOT: 2, sc.GPU_NCCL_COMM: "0xc0",
        sc.GPU_NCCL_COMM_NRANKS: 4, sc.GPU_NCCL_COMM_RANK: 1, sc.GPU_NCCL_GROUP: "0x1f", sc.GPU_STREAM: "0x50"}


def test_what_is_not_known_is_left_out_not_guessed():
    a = call_attributes(call("ncclRecv", datatype=99, redop=NCCL_NO_OP, peer=3, nranks=0, rank=-1,
                             unreadable=True), {})
    assert a[sc.GPU_NCCL_PEER] == 3 and a[sc.GPU_NCCL_DATATYPE] == "unknown" and a[sc.GPU_ARGS_UNREADABLE]
    for absent in (sc.GPU_NCCL_BYTES, sc.GPU_NCCL_REDUCTION, sc.GPU_NCCL_ROOT, sc.GPU_NCCL_COMM_NRANKS,
                   sc.GPU_NCCL_COMM_RANK, sc.GPU_NCCL_GROUP, sc.GPU_STREAM):
        assert absent not in a, absent
    assert nccl.redop_name(9) == "custom"  # a user-made ncclRedOp_t


def test_summary_counts_nccl_calls_and_bytes_only_when_there_are_any():
    sink = CallSink(1)  # the second call is rolled up: the summary still counts it
    sink.add(call(nbytes=40), "thread")
    sink.add(call("ncclAllGather", nbytes=64), "thread")
    s = summary_attributes(sink.summary)
    assert (s[sc.GPU_NCCL_CALLS], s[sc.GPU_NCCL_TOTAL_BYTES], s[sc.GPU_LAUNCHES]) == (2, 104, 0)
    assert sc.GPU_NCCL_CALLS not in summary_attributes(CallSink(1).summary)


def test_metric_counts_calls_and_bytes_by_op():
    reader = InMemoryMetricReader()
    m = GpuMetrics([reader])
    w = ProcessWindow(9, "outside", 0, 10, CallSink(1))
    for c in (call(nbytes=40), call(nbytes=40), call("ncclSend", nbytes=8)):
        w.sink.add(c, "outside")
    w.kernel_names = {}
    m.process([w])
    got = {}
    for rm in reader.get_metrics_data().resource_metrics:
        for sm in rm.scope_metrics:
            for metric in sm.metrics:
                if metric.name.startswith("gpu.nccl"):
                    for p in metric.data.data_points:
                        got[(metric.name, p.attributes[sc.GPU_NCCL_OP])] = p.value
    assert got == {("gpu.nccl.calls", "all_reduce"): 2, ("gpu.nccl.calls", "send"): 1,
                   ("gpu.nccl.bytes", "all_reduce"): 80, ("gpu.nccl.bytes", "send"): 8}


def test_libnccl_files_are_found_in_maps():
    maps = ("7f00-7f10 r-xp 0 08:01 1 /venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2\n"
            "7f20-7f30 r-xp 0 08:01 2 /usr/lib/x86_64-linux-gnu/libnccl-net.so\n")
    assert libraries_in_maps(maps) == [(NCCL, "/venv/lib/python3.12/site-packages/nvidia/nccl/lib/libnccl.so.2")]


def test_calls_past_the_span_budget_roll_up_by_communicator():
    import random

    from opentelemetry.sdk.resources import Resource

    from otel_gpu.clock import BpfClock
    from otel_gpu.export.spans import SpanBuilder
    w = ProcessWindow(9, "outside", 0, 10, CallSink(0))  # budget 0: every call rolls up
    for comm, nbytes in ((0xC0, 40), (0xC0, 40), (0xC1, 8)):
        w.sink.add(call(comm=comm, nbytes=nbytes), "outside")
    w.resource, w.kernel_names = Resource({}), {}
    _, *kids = SpanBuilder(BpfClock(), ids=random.Random(1)).build(w)
    got = {(k.attributes[sc.GPU_NCCL_OP], k.attributes[sc.GPU_NCCL_COMM]):
           (k.attributes[sc.GPU_ROLLUP_COUNT], k.attributes[sc.GPU_ROLLUP_BYTES]) for k in kids}
    assert got == {("all_reduce", "0xc0"): (2, 80), ("all_reduce", "0xc1"): (1, 8)}
