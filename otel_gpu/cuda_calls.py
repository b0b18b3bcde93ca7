"""The GPU call table (CUDA, NCCL/RCCL and HIP) and the names of the files probed, as
data; which probe goes on which symbol of each file is probes/rows.py.

One row per CUDA call says everything the rest of otel-gpu needs to know about it:
its id (shared with the BPF side, which gets the ids as generated #defines), the
symbols and BPF handlers to attach, and its category, which decides the event shape
it arrives in, what its rollup key means, the span attributes, the request summary and
the metrics. Adding a call of an existing category is one row here plus one small
handler in bpf/cuda_probes.c."""
from __future__ import annotations

from dataclasses import dataclass
from enum import Enum
from typing import Optional

RUNTIME = "cudart"  # libcudart.so*, or an executable with cudart linked statically
DRIVER = "cuda"     # libcuda.so*
PYTHON = "python"   # a CPython interpreter (libpython3.X.so* or the executable): not CUDA calls
NCCL = "nccl"       # libnccl.so*, or ROCm's librccl.so* (the same API): collectives and point-to-point calls
HIP = "hip"         # libamdhip64.so*: ROCm's HIP runtime (bpf/hip_probes.c)
TLS = "ssl"         # OpenSSL's libssl.so.3 / .so.1.1: TLS plaintext (bpf/tls_probes.c), not CUDA calls
GO = "go"           # a Go executable: goroutine starts and hand-offs (bpf/go_probes.c), not CUDA calls
DEVICE_CLOCK = "otel_gpu_cupti"  # libotel_gpu_cupti.so: device-timed GPU activity (bpf/device_records.c)
# A runtime file whose launches are routed (probes/launch_routes.py, bpf/launch_routes.c) is
# probed in four parts: its other calls (for every process, or per process with --pid),
# its kernel launch entries and its graph launch entries per process while they are
# needed, and the kernel launches' learners beside them.
RUNTIME_CALLS = "cudart-calls"
RUNTIME_LAUNCHES = "cudart-launches"
RUNTIME_GRAPH_LAUNCHES = "cudart-graph-launches"
RUNTIME_LEARNERS = "cudart-learners"


class Category(str, Enum):
    """What a call does, as far as spans, summaries, cost and metrics care."""
    LAUNCH = "launch"   # a kernel launch: function, grid, block, shared memory, stream
    GRAPH = "graph"     # a CUDA graph launch: counts as a launch; its kernels come from the capture (pipeline/graphs.py)
    MEMCPY = "memcpy"   # a copy: bytes, direction, stream
    ALLOC = "alloc"     # device memory allocated: pointer (at return), bytes
    FREE = "free"       # device memory freed: pointer
    SYNC = "sync"       # the host waits: handle (stream or event), duration
    DEVICE = "device"   # the thread's current device changes: ordinal
    NAME = "name"       # hands out a kernel handle: what later launches of it run (not a span)
    GRAPH_OP = "graph_op"  # a CUDA graph's capture, instantiation or end: what its launches run (not a span)
    COLLECTIVE = "collective"  # an NCCL collective or send/recv: op, bytes, datatype, communicator


class Shape(str, Enum):
    """The ring-buffer record a call arrives in (one C struct each in bpf/events.h)."""
    LAUNCH = "launch"
    MEMCPY = "memcpy"
    MEMORY = "memory"
    SYNC = "sync"
    GRAPH = "graph"
    DEVICE = "device"
    HANDLE = "handle"  # kernel_handle_event: decoded to records.KernelHandle, not a CudaCall
    GRAPH_OP = "graph_op"  # graph_op_event: decoded to records.GraphOp, not a CudaCall
    NCCL = "nccl"


SHAPE_OF = {
    Category.LAUNCH: Shape.LAUNCH, Category.GRAPH: Shape.GRAPH, Category.MEMCPY: Shape.MEMCPY,
    Category.ALLOC: Shape.MEMORY, Category.FREE: Shape.MEMORY, Category.SYNC: Shape.SYNC,
    Category.DEVICE: Shape.DEVICE, Category.NAME: Shape.HANDLE,
    Category.GRAPH_OP: Shape.GRAPH_OP, Category.COLLECTIVE: Shape.NCCL,
}

# What the 64-bit `detail` of an in-kernel rollup key (and of a span rollup) holds, by
# category. bpf/cuda_probes.c fills it the same way (a bpf-tier test checks each).
ROLLUP_DETAIL = {
    Category.LAUNCH: "kernel function", Category.GRAPH: "graph exec",
    Category.MEMCPY: "direction (cudaMemcpyKind)", Category.ALLOC: "pointer",
    Category.FREE: "pointer", Category.SYNC: "none (0)", Category.DEVICE: "device ordinal",
    Category.NAME: "never rolled up: always sent (once per kernel)",
    Category.GRAPH_OP: "never rolled up: always sent (once per capture, graph)",
    Category.COLLECTIVE: "communicator (ncclComm_t)",
}

API_CUDA, API_HIP = "cuda", "hip"

# cudaMemcpyKind, as the runtime numbers it (hipMemcpyKind numbers them the same).
MEMCPY_DIRECTIONS = {0: "h2h", 1: "h2d", 2: "d2h", 3: "d2d", 4: "default"}


@dataclass(frozen=True)
class CallSpec:
    id: int                    # enum value shared with the BPF side (CALL_<CONST>)
    name: str                  # the API name: span names, gpu.cuda.call
    category: Category
    library: str               # RUNTIME, DRIVER, NCCL or HIP
    symbols: tuple[str, ...]   # every exported variant (per-thread-stream _ptsz/_ptds too)
    entry: str                 # BPF function run at entry
    ret: Optional[str] = None  # BPF function run at return (~2x the cost: only where needed)
    const: str = ""            # C name suffix: CALL_<const>

    @property
    def shape(self) -> Shape:
        return SHAPE_OF[self.category]

    @property
    def api(self) -> str:
        """Whose API the call is, for the names that differ by vendor (semconv.CALL_ATTRIBUTES,
        the gpu.<api>.* metrics): "hip" for libamdhip64's calls, "cuda" for the rest (NCCL's
        calls keep gpu.cuda.call, RCCL's too: one API, docs/spans-and-metrics.md)."""
        return API_HIP if self.library == HIP else API_CUDA

    @property
    def is_launch(self) -> bool:
        """Counted in gpu.launches (graph launches too)."""
        return self.category in (Category.LAUNCH, Category.GRAPH)


def _row(id_, name, category, symbols, entry, ret=None, library=RUNTIME, const=""):
    return CallSpec(id_, name, category, library, tuple(symbols), entry, ret, const)


L, G, M, A, F, S, D, N, C = (Category.LAUNCH, Category.GRAPH, Category.MEMCPY, Category.ALLOC,
                             Category.FREE, Category.SYNC, Category.DEVICE, Category.NAME, Category.COLLECTIVE)
O = Category.GRAPH_OP
CALLS: tuple[CallSpec, ...] = (
    _row(1, "cudaLaunchKernel", L, ["cudaLaunchKernel", "cudaLaunchKernel_ptsz"], "cuda_launch_kernel",
         const="LAUNCH_KERNEL"),
    _row(2, "cudaLaunchKernelExC", L, ["cudaLaunchKernelExC", "cudaLaunchKernelExC_ptsz"],
         "cuda_launch_kernel_exc", const="LAUNCH_KERNEL_EXC"),
    _row(3, "cudaMemcpy", M, ["cudaMemcpy", "cudaMemcpy_ptds"], "cuda_memcpy", const="MEMCPY"),
    _row(4, "cudaMemcpyAsync", M, ["cudaMemcpyAsync", "cudaMemcpyAsync_ptsz"], "cuda_memcpy_async",
         const="MEMCPY_ASYNC"),
    _row(5, "cudaMalloc", A, ["cudaMalloc"], "cuda_malloc_enter", "cuda_call_return", const="MALLOC"),
    _row(6, "cudaFree", F, ["cudaFree"], "cuda_free", const="FREE"),
    _row(7, "cudaStreamSynchronize", S, ["cudaStreamSynchronize", "cudaStreamSynchronize_ptsz"],
         "cuda_stream_sync_enter", "cuda_call_return", const="STREAM_SYNC"),
    _row(8, "cudaDeviceSynchronize", S, ["cudaDeviceSynchronize"], "cuda_device_sync_enter",
         "cuda_call_return", const="DEVICE_SYNC"),
    _row(9, "cudaEventSynchronize", S, ["cudaEventSynchronize"], "cuda_event_sync_enter",
         "cuda_call_return", const="EVENT_SYNC"),
    _row(10, "cudaGraphLaunch", G, ["cudaGraphLaunch", "cudaGraphLaunch_ptsz"], "cuda_graph_launch",
         const="GRAPH_LAUNCH"),
    _row(11, "cuLaunchKernel", L, ["cuLaunchKernel", "cuLaunchKernel_ptsz"], "cu_launch_kernel",
         library=DRIVER, const="CU_LAUNCH_KERNEL"),
    _row(12, "cuLaunchKernelEx", L, ["cuLaunchKernelEx", "cuLaunchKernelEx_ptsz"], "cu_launch_kernel_ex",
         library=DRIVER, const="CU_LAUNCH_KERNEL_EX"),
    _row(13, "cudaSetDevice", D, ["cudaSetDevice"], "cuda_set_device", const="SET_DEVICE"),
    _row(14, "cudaMemcpy2DAsync", M, ["cudaMemcpy2DAsync", "cudaMemcpy2DAsync_ptsz"],
         "cuda_memcpy_2d_async", const="MEMCPY_2D_ASYNC"),
    # Kernel handles and what they name (launches of a handle are named through them;
    # __cudaLaunchKernel(_ptsz), the CUDA 13 <<<>>> launch, jumps into cudaLaunchKernel).
    _row(15, "cuModuleGetFunction", N, ["cuModuleGetFunction"], "cu_module_get_function",
         "cu_module_get_function_return", library=DRIVER, const="CU_MODULE_GET_FUNCTION"),
    _row(16, "cuLibraryGetKernel", N, ["cuLibraryGetKernel"], "cu_library_get_kernel",
         "cu_library_get_kernel_return", library=DRIVER, const="CU_LIBRARY_GET_KERNEL"),
    _row(17, "cuKernelGetFunction", N, ["cuKernelGetFunction"], "cu_kernel_get_function",
         "cu_kernel_get_function_return", library=DRIVER, const="CU_KERNEL_GET_FUNCTION"),
    _row(18, "__cudaGetKernel", N, ["__cudaGetKernel"], "cuda_get_kernel_internal",
         "cuda_get_kernel_internal_return", const="CUDA_GET_KERNEL_INTERNAL"),
    _row(19, "cudaGetKernel", N, ["cudaGetKernel"], "cuda_get_kernel", "cuda_get_kernel_return",
         const="CUDA_GET_KERNEL"),
    _row(20, "cudaLibraryGetKernel", N, ["cudaLibraryGetKernel"], "cuda_library_get_kernel",
         "cuda_library_get_kernel_return", const="CUDA_LIBRARY_GET_KERNEL"),
    # NCCL (bpf/nccl_probes.c), ids from 40 so CUDA rows can grow below them. Entry only:
    # the arguments say everything; bytes are what the rank receives (NCCL_OPS).
    _row(40, "ncclAllReduce", C, ["ncclAllReduce"], "nccl_all_reduce", library=NCCL, const="NCCL_ALL_REDUCE"),
    _row(41, "ncclAllGather", C, ["ncclAllGather"], "nccl_all_gather", library=NCCL, const="NCCL_ALL_GATHER"),
    _row(42, "ncclReduceScatter", C, ["ncclReduceScatter"], "nccl_reduce_scatter", library=NCCL,
         const="NCCL_REDUCE_SCATTER"),
    _row(43, "ncclBroadcast", C, ["ncclBroadcast"], "nccl_broadcast", library=NCCL, const="NCCL_BROADCAST"),
    _row(44, "ncclReduce", C, ["ncclReduce"], "nccl_reduce", library=NCCL, const="NCCL_REDUCE"),
    _row(45, "ncclSend", C, ["ncclSend"], "nccl_send", library=NCCL, const="NCCL_SEND"),
    _row(46, "ncclRecv", C, ["ncclRecv"], "nccl_recv", library=NCCL, const="NCCL_RECV"),
    # CUDA graphs (bpf/graph_probes.c), ids 29-39: capture (kernels launched on the
    # capturing stream are recorded, not run), graph -> exec, their end, the driver launch.
    _row(29, "cuGraphLaunch", G, ["cuGraphLaunch", "cuGraphLaunch_ptsz"], "cu_graph_launch", library=DRIVER,
         const="CU_GRAPH_LAUNCH"),
    _row(30, "cudaStreamBeginCapture", O, ["cudaStreamBeginCapture", "cudaStreamBeginCapture_ptsz"],
         "cuda_stream_begin_capture", "cuda_stream_begin_capture_return", const="STREAM_BEGIN_CAPTURE"),
    _row(31, "cuStreamBeginCapture", O, ["cuStreamBeginCapture", "cuStreamBeginCapture_v2",
                                         "cuStreamBeginCapture_ptsz", "cuStreamBeginCapture_v2_ptsz"],
         "cu_stream_begin_capture", "cu_stream_begin_capture_return", library=DRIVER,
         const="CU_STREAM_BEGIN_CAPTURE"),
    _row(32, "cudaStreamEndCapture", O, ["cudaStreamEndCapture", "cudaStreamEndCapture_ptsz"],
         "cuda_stream_end_capture", "cuda_stream_end_capture_return", const="STREAM_END_CAPTURE"),
    _row(33, "cuStreamEndCapture", O, ["cuStreamEndCapture", "cuStreamEndCapture_ptsz"],
         "cu_stream_end_capture", "cu_stream_end_capture_return", library=DRIVER, const="CU_STREAM_END_CAPTURE"),
    _row(34, "cudaGraphInstantiate", O, ["cudaGraphInstantiate", "cudaGraphInstantiateWithFlags",
                                         "cudaGraphInstantiateWithParams"],
         "cuda_graph_instantiate", "cuda_graph_instantiate_return", const="GRAPH_INSTANTIATE"),
    _row(35, "cuGraphInstantiate", O, ["cuGraphInstantiate", "cuGraphInstantiate_v2", "cuGraphInstantiateWithFlags",
                                       "cuGraphInstantiateWithParams"],
         "cu_graph_instantiate", "cu_graph_instantiate_return", library=DRIVER, const="CU_GRAPH_INSTANTIATE"),
    _row(36, "cudaGraphDestroy", O, ["cudaGraphDestroy"], "cuda_graph_destroy", const="GRAPH_DESTROY"),
    _row(37, "cudaGraphExecDestroy", O, ["cudaGraphExecDestroy"], "cuda_graph_exec_destroy",
         const="GRAPH_EXEC_DESTROY"),
    _row(38, "cuGraphDestroy", O, ["cuGraphDestroy"], "cu_graph_destroy", library=DRIVER, const="CU_GRAPH_DESTROY"),
    _row(39, "cuGraphExecDestroy", O, ["cuGraphExecDestroy"], "cu_graph_exec_destroy", library=DRIVER,
         const="CU_GRAPH_EXEC_DESTROY"),
    # ROCm's HIP runtime (bpf/hip_probes.c), ids from 60. hipLaunchKernel has cudaLaunchKernel's
    # layout and hipModuleLaunchKernel cuLaunchKernel's; the fixed-direction copies carry
    # their direction in the name. _spt: the per-thread default stream variants (ROCm 6+).
    # hipExtModuleLaunchKernel is C++-mangled in HIP 5 (hip_ext.h), plain C in later releases.
    _row(60, "hipLaunchKernel", L, ["hipLaunchKernel", "hipLaunchKernel_spt"], "hip_launch_kernel", library=HIP,
         const="HIP_LAUNCH_KERNEL"),
    _row(61, "hipExtLaunchKernel", L, ["hipExtLaunchKernel"], "hip_ext_launch_kernel", library=HIP,
         const="HIP_EXT_LAUNCH_KERNEL"),
    _row(62, "hipLaunchCooperativeKernel", L, ["hipLaunchCooperativeKernel", "hipLaunchCooperativeKernel_spt"],
         "hip_launch_cooperative_kernel", library=HIP, const="HIP_LAUNCH_COOPERATIVE_KERNEL"),
    _row(63, "hipModuleLaunchKernel", L, ["hipModuleLaunchKernel"], "hip_module_launch_kernel", library=HIP,
         const="HIP_MODULE_LAUNCH_KERNEL"),
    _row(64, "hipExtModuleLaunchKernel", L,
         ["hipExtModuleLaunchKernel",
          "_Z24hipExtModuleLaunchKernelP18ihipModuleSymbol_tjjjjjjmP12ihipStream_tPPvS4_P11ihipEvent_tS6_j"],
         "hip_ext_module_launch_kernel", library=HIP, const="HIP_EXT_MODULE_LAUNCH_KERNEL"),
    _row(65, "hipGraphLaunch", G, ["hipGraphLaunch", "hipGraphLaunch_spt"], "hip_graph_launch", library=HIP,
         const="HIP_GRAPH_LAUNCH"),
    _row(66, "hipMemcpy", M, ["hipMemcpy", "hipMemcpy_spt"], "hip_memcpy", library=HIP, const="HIP_MEMCPY"),
    _row(67, "hipMemcpyAsync", M, ["hipMemcpyAsync", "hipMemcpyAsync_spt"], "hip_memcpy_async", library=HIP,
         const="HIP_MEMCPY_ASYNC"),
    _row(68, "hipMemcpyHtoD", M, ["hipMemcpyHtoD"], "hip_memcpy_htod", library=HIP, const="HIP_MEMCPY_HTOD"),
    _row(69, "hipMemcpyDtoH", M, ["hipMemcpyDtoH"], "hip_memcpy_dtoh", library=HIP, const="HIP_MEMCPY_DTOH"),
    _row(70, "hipMemcpyDtoD", M, ["hipMemcpyDtoD"], "hip_memcpy_dtod", library=HIP, const="HIP_MEMCPY_DTOD"),
    _row(71, "hipMemcpyHtoDAsync", M, ["hipMemcpyHtoDAsync"], "hip_memcpy_htod_async", library=HIP,
         const="HIP_MEMCPY_HTOD_ASYNC"),
    _row(72, "hipMemcpyDtoHAsync", M, ["hipMemcpyDtoHAsync"], "hip_memcpy_dtoh_async", library=HIP,
         const="HIP_MEMCPY_DTOH_ASYNC"),
    _row(73, "hipMemcpyDtoDAsync", M, ["hipMemcpyDtoDAsync"], "hip_memcpy_dtod_async", library=HIP,
         const="HIP_MEMCPY_DTOD_ASYNC"),
    _row(74, "hipMemcpy2DAsync", M, ["hipMemcpy2DAsync", "hipMemcpy2DAsync_spt"], "hip_memcpy_2d_async",
         library=HIP, const="HIP_MEMCPY_2D_ASYNC"),
    _row(75, "hipMalloc", A, ["hipMalloc"], "hip_malloc_enter", "cuda_call_return", library=HIP, const="HIP_MALLOC"),
    _row(76, "hipFree", F, ["hipFree"], "hip_free", library=HIP, const="HIP_FREE"),
    _row(77, "hipStreamSynchronize", S, ["hipStreamSynchronize", "hipStreamSynchronize_spt"],
         "hip_stream_sync_enter", "cuda_call_return", library=HIP, const="HIP_STREAM_SYNC"),
    _row(78, "hipDeviceSynchronize", S, ["hipDeviceSynchronize"], "hip_device_sync_enter", "cuda_call_return",
         library=HIP, const="HIP_DEVICE_SYNC"),
    _row(79, "hipEventSynchronize", S, ["hipEventSynchronize"], "hip_event_sync_enter", "cuda_call_return",
         library=HIP, const="HIP_EVENT_SYNC"),
    _row(80, "hipSetDevice", D, ["hipSetDevice"], "hip_set_device", library=HIP, const="HIP_SET_DEVICE"),
    # Kernel names: a hipcc program registers each kernel's host handle with its mangled name
    # (the handle its launches pass: named at entry, no out-parameter); the module API
    # hands out a hipFunction_t for a name, as cuModuleGetFunction does.
    _row(81, "__hipRegisterFunction", N, ["__hipRegisterFunction"], "hip_register_function", library=HIP,
         const="HIP_REGISTER_FUNCTION"),
    _row(82, "hipModuleGetFunction", N, ["hipModuleGetFunction"], "hip_module_get_function",
         "hip_module_get_function_return", library=HIP, const="HIP_MODULE_GET_FUNCTION"),
)
del L, G, M, A, F, S, D, N, C, O

BY_ID: dict[int, CallSpec] = {c.id: c for c in CALLS}
BY_NAME: dict[str, CallSpec] = {c.name: c for c in CALLS}
API_OF: dict[int, str] = {c.id: c.api for c in CALLS}  # call id -> "cuda" or "hip"
CALL_MAX = max(BY_ID) + 1


def call_id(name: str) -> int:
    return BY_NAME[name].id


def spec_of(call: int) -> Optional[CallSpec]:
    return BY_ID.get(call)


def call_name(call: int) -> str:
    spec = BY_ID.get(call)
    return spec.name if spec else f"cuda_call_{call}"


def ids_in(*categories: Category) -> frozenset[int]:
    return frozenset(c.id for c in CALLS if c.category in categories)


def c_defines() -> str:
    """The call ids for the BPF program, generated from the table (prepended to the C
    text at load, and to bpf/events.h in the layout test)."""
    lines = ["/* Generated from otel_gpu/cuda_calls.py: CUDA call ids. */"]
    lines += [f"#define CALL_{c.const} {c.id}" for c in CALLS]
    lines.append(f"#define CALL_MAX {CALL_MAX}")
    # The calls whose return handler reads an allocated pointer (bpf/cuda_probes.c
    # cuda_call_return), and those a thread waits on the GPU in (bpf/sched_probes.c).
    for category in (Category.ALLOC, Category.SYNC):
        ids = " || ".join(f"(c) == CALL_{c.const}" for c in CALLS if c.category is category)
        lines.append(f"#define CALL_IS_{category.name}(c) ({ids})")
    return "\n".join(lines) + "\n"
