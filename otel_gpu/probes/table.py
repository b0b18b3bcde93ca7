"""What is attached where, as data. Adding a CUDA function is one row here plus
one small handler in bpf/cuda_probes.c."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

RUNTIME = "cudart"  # libcudart.so*, or an executable with cudart linked statically
DRIVER = "cuda"     # libcuda.so*


@dataclass(frozen=True)
class UprobeRow:
    library: str            # RUNTIME or DRIVER
    symbol: str
    entry: str              # BPF function run at entry
    ret: Optional[str] = None  # BPF function run at return (costs ~2x: only where needed)


def _rt(symbols, entry, ret=None):
    return [UprobeRow(RUNTIME, s, entry, ret) for s in symbols]


CUDA_PROBES: tuple[UprobeRow, ...] = tuple(
    _rt(["cudaLaunchKernel", "cudaLaunchKernel_ptsz"], "cuda_launch_kernel")
    + _rt(["cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz"], "cuda_launch_kernel_exc")
    + _rt(["cudaMemcpy", "cudaMemcpy_ptds"], "cuda_memcpy")
    + _rt(["cudaMemcpyAsync", "cudaMemcpyAsync_ptsz"], "cuda_memcpy_async")
    + _rt(["cudaMalloc"], "cuda_malloc_enter", "cuda_call_return")
    + _rt(["cudaFree"], "cuda_free")
    + _rt(["cudaStreamSynchronize", "cudaStreamSynchronize_ptsz"], "cuda_stream_sync_enter", "cuda_call_return")
    + _rt(["cudaDeviceSynchronize"], "cuda_device_sync_enter", "cuda_call_return")
    + _rt(["cudaEventSynchronize"], "cuda_event_sync_enter", "cuda_call_return")
    + _rt(["cudaGraphLaunch", "cudaGraphLaunch_ptsz"], "cuda_graph_launch")
    + _rt(["cudaSetDevice"], "cuda_set_device")
    + [UprobeRow(DRIVER, s, "cu_launch_kernel") for s in ("cuLaunchKernel", "cuLaunchKernel_ptsz")]
    + [UprobeRow(DRIVER, s, "cu_launch_kernel_ex") for s in ("cuLaunchKernelEx", "cuLaunchKernelEx_ptsz")]
)

# Syscall tracepoints of the HTTP probes (bcc attaches TRACEPOINT_PROBE functions
# by itself; this list is what `otel-gpu run` reports and the detach test checks).
HTTP_TRACEPOINTS: tuple[str, ...] = tuple(
    f"syscalls:sys_{phase}_{call}"
    for call in ("accept4", "accept", "read", "recvfrom", "readv", "recvmsg",
                 "write", "sendto", "writev", "sendmsg")
    for phase in ("enter", "exit")
) + ("syscalls:sys_enter_close", "sched:sched_process_exit")


def rows_for(library: str) -> list[UprobeRow]:
    return [r for r in CUDA_PROBES if r.library == library]
