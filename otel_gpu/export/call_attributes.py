"""What a GPU call's span and a request's summary say, as attributes: by the call's
category (cuda_calls.py), its API's keys (gpu.cuda.* or gpu.hip.*), and what the device
timed of it in device-clock mode (export/spans.py builds the spans around them)."""
from __future__ import annotations

from .. import semconv as sc
from ..cuda_calls import API_CUDA, API_OF, BY_ID, MEMCPY_DIRECTIONS, Category
from ..pipeline import busy_time
from ..probes import nccl
from ..records import CudaCall


def category_of(call: int):
    spec = BY_ID.get(call)
    return spec.category if spec else None


def kernel_attributes(func: int, names: dict) -> dict:
    attrs = {sc.GPU_KERNEL_FUNC: hex(func)}
    name = names.get(func)
    if name:
        attrs[sc.GPU_KERNEL_NAME] = name
    return attrs


def graph_kernel_attributes(kernels, names: dict) -> dict:
    """What one graph launch runs (pipeline/graphs.py); nothing when its capture was not seen."""
    if not kernels:
        return {}
    return {sc.GPU_GRAPH_KERNELS: [names.get(f) or hex(f) for f, _n in kernels],
            sc.GPU_GRAPH_KERNEL_COUNTS: [n for _f, n in kernels],
            sc.GPU_GRAPH_KERNEL_NODES: sum(n for _f, n in kernels)}


def _stream(stream: int) -> dict:
    return {sc.GPU_STREAM: hex(stream)} if stream else {}


# What a call's span says, by category (cuda_calls.py): a new call of an existing
# category needs nothing here.
# A call whose probe could not read an argument (c.unreadable) says so, and leaves out
# what came from memory rather than exporting zeros as values.
_ATTRIBUTES = {
    Category.LAUNCH: lambda c, names: {**kernel_attributes(c.func, names), sc.GPU_ARGS_UNREADABLE: True}
    if c.unreadable else {**kernel_attributes(c.func, names), sc.GPU_GRID: list(c.grid), sc.GPU_BLOCK: list(c.block),
                          sc.GPU_SHARED_MEMORY_BYTES: c.shmem, sc.GPU_STREAM: hex(c.stream)},
    Category.MEMCPY: lambda c, _n: {sc.GPU_MEMCPY_BYTES: c.bytes, sc.GPU_ARGS_UNREADABLE: True}
    if c.unreadable else {sc.GPU_MEMCPY_BYTES: c.bytes,
                          sc.GPU_MEMCPY_DIRECTION: MEMCPY_DIRECTIONS.get(c.direction, "default"),
                          **_stream(c.stream)},
    Category.ALLOC: lambda c, _n: {sc.GPU_ALLOC_BYTES: c.bytes},
    Category.FREE: lambda c, _n: {},
    Category.SYNC: lambda c, _n: _stream(c.handle),
    Category.GRAPH: lambda c, names: {**_stream(c.stream), **graph_kernel_attributes(c.kernels, names)},
    Category.DEVICE: lambda c, _n: {},
    Category.COLLECTIVE: lambda c, _n: _nccl(c),
}


def _nccl(c) -> dict:
    """An NCCL call's span: what it moved and over which communicator. Left out rather
    than guessed: bytes of an unknown datatype, the communicator's size and rank when its
    init was not seen, the stream when a stack argument could not be read."""
    attrs = {sc.GPU_NCCL_OP: nccl.op_name(c.call), sc.GPU_NCCL_COUNT: c.count,
             sc.GPU_NCCL_DATATYPE: nccl.datatype_name(c.datatype), sc.GPU_NCCL_COMM: hex(c.comm)}
    if c.datatype in nccl.DATATYPES:
        attrs[sc.GPU_NCCL_BYTES] = c.bytes
    reduction = nccl.redop_name(c.redop)
    if reduction is not None:
        attrs[sc.GPU_NCCL_REDUCTION] = reduction
    if c.call in nccl.ROOTED:
        attrs[sc.GPU_NCCL_ROOT] = c.peer
    elif c.call in nccl.POINT_TO_POINT:
        attrs[sc.GPU_NCCL_PEER] = c.peer
    if c.nranks:
        attrs[sc.GPU_NCCL_COMM_NRANKS] = c.nranks
        attrs[sc.GPU_NCCL_COMM_RANK] = c.rank
    if c.group:
        attrs[sc.GPU_NCCL_GROUP] = hex(c.group)
    if c.unreadable:
        attrs[sc.GPU_ARGS_UNREADABLE] = True
    else:
        attrs.update(_stream(c.stream))
    return attrs


def call_keys(call: int) -> tuple[str, str]:
    """The call's (name, return code) attribute keys: gpu.cuda.* or gpu.hip.*, by its API."""
    return sc.CALL_ATTRIBUTES[API_OF.get(call, API_CUDA)]


def api_label(call: int) -> str:
    return API_OF.get(call, API_CUDA).upper()  # "CUDA error 35", "HIP error 101"


def call_attributes(c: CudaCall, kernel_names: dict) -> dict:
    name_key, code_key = call_keys(c.call)
    attrs = {name_key: c.name, sc.GPU_TIMING: "host_enqueue"}
    if c.ret >= 0:
        attrs[code_key] = c.ret
    category = category_of(c.call)
    if category is not None:
        attrs.update(_ATTRIBUTES[category](c, kernel_names))
    return attrs


def device_attributes(c: CudaCall) -> dict:
    """Device-clock mode (pipeline/device_times.py): when the device ran what the call
    launched, after the call entered, and for how long (a graph launch: its kernels' union)."""
    start = min(s for s, _ in c.device_ns)
    attrs = {sc.GPU_DEVICE_QUEUE_NS: start - c.ts_ns,
             sc.GPU_DEVICE_DURATION_NS: sum(e - s for s, e in busy_time.union(c.device_ns))}
    if len(c.device_ns) > 1:
        attrs[sc.GPU_DEVICE_KERNELS] = len(c.device_ns)
    return attrs


def summary_attributes(s) -> dict:
    b = s.memcpy_bytes
    return {
        sc.GPU_CALLS: s.calls,
        sc.GPU_LAUNCHES: s.launches,
        sc.GPU_MEMCPY_H2D_BYTES: b.get("h2d", 0),
        sc.GPU_MEMCPY_D2H_BYTES: b.get("d2h", 0),
        sc.GPU_MEMCPY_D2D_BYTES: b.get("d2d", 0),
        sc.GPU_MEMCPY_OTHER_BYTES: b.get("h2h", 0) + b.get("default", 0),
        sc.GPU_SYNC_DURATION_NS: s.sync_ns,
        sc.GPU_DISTINCT_KERNELS: len(s.kernels),
        sc.GPU_CALLS_AMBIGUOUS: s.ambiguous,
        **({sc.GPU_NCCL_CALLS: s.nccl_calls, sc.GPU_NCCL_TOTAL_BYTES: s.nccl_bytes} if s.nccl_calls else {}),
        **({sc.GPU_GRAPH_KERNEL_LAUNCHES: s.graph_kernels} if s.graph_kernels else {}),
    }
