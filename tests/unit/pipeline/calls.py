"""Typed CUDA call records for unit tests, by API name: cuda("cudaMemcpy", nbytes=64, kind=1)."""
from otel_gpu.records import DeviceCall, GraphCall, LaunchCall, MemcpyCall, MemoryCall, NcclCall, SyncCall
from otel_gpu.cuda_calls import BY_NAME, Category


def cuda(name="cudaLaunchKernel", tid=1, func=0x1000, nbytes=0, kind=0, pid=1, duration=0, ts=0,
         ret=0, grid=(1, 1, 1), block=(32, 1, 1), stream=0, ctx=0):
    """`func` is the kernel, graph exec, pointer or handle; `kind` the memcpy direction
    or the device ordinal, as the call's category has it."""
    spec = BY_NAME[name]
    head = (pid, tid, ts, spec.id, ret)
    c = spec.category
    if c is Category.LAUNCH:
        return LaunchCall(*head, func, grid, block, 0, stream, ctx=ctx)
    if c is Category.MEMCPY:
        return MemcpyCall(*head, nbytes, kind, stream, ctx=ctx)
    if c in (Category.ALLOC, Category.FREE):
        return MemoryCall(*head, func, nbytes, duration, ctx=ctx)
    if c is Category.SYNC:
        return SyncCall(*head, func, duration, ctx=ctx)
    if c is Category.GRAPH:
        return GraphCall(*head, func, stream, ctx=ctx)
    if c is Category.COLLECTIVE:  # func is the communicator; float32, sum, 2 ranks
        return NcclCall(*head, nbytes // 4, nbytes, 7, 0, -1, func, 2, 0, stream, 0, ctx=ctx)
    return DeviceCall(*head, kind, ctx=ctx)
