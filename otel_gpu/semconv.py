"""Every attribute name otel-gpu exports, in one place (tests/unit/test_semconv.py pins them).

Standard names follow the OpenTelemetry semantic conventions; ours live under `gpu.`
and `otel_gpu.` and are listed in docs/attributes.md (generated from this file).
"""

# HTTP server spans (semconv, stable HTTP conventions).
HTTP_REQUEST_METHOD = "http.request.method"
HTTP_ROUTE = "http.route"
HTTP_RESPONSE_STATUS_CODE = "http.response.status_code"
URL_PATH = "url.path"
URL_QUERY = "url.query"  # exported only when configured (privacy by default)
URL_SCHEME = "url.scheme"
SERVER_PORT = "server.port"
CLIENT_ADDRESS = "client.address"
CLIENT_PORT = "client.port"
NETWORK_PROTOCOL_VERSION = "network.protocol.version"
ERROR_TYPE = "error.type"

# gRPC server spans (semconv RPC conventions): pipeline/protocols/http2/grpc.py.
RPC_SYSTEM = "rpc.system"
RPC_SERVICE = "rpc.service"
RPC_METHOD = "rpc.method"
RPC_GRPC_STATUS_CODE = "rpc.grpc.status_code"

# Process and thread (semconv).
PROCESS_PID = "process.pid"
PROCESS_EXECUTABLE_NAME = "process.executable.name"
PROCESS_EXECUTABLE_PATH = "process.executable.path"
PROCESS_COMMAND_LINE = "process.command_line"
THREAD_ID = "thread.id"
SERVICE_NAME = "service.name"
HOST_NAME = "host.name"

# Kubernetes and containers (semconv resource attributes).
CONTAINER_ID = "container.id"
K8S_POD_NAME = "k8s.pod.name"
K8S_POD_UID = "k8s.pod.uid"
K8S_NAMESPACE_NAME = "k8s.namespace.name"
K8S_CONTAINER_NAME = "k8s.container.name"
K8S_NODE_NAME = "k8s.node.name"
K8S_DEPLOYMENT_NAME = "k8s.deployment.name"
K8S_REPLICASET_NAME = "k8s.replicaset.name"
K8S_STATEFULSET_NAME = "k8s.statefulset.name"
K8S_DAEMONSET_NAME = "k8s.daemonset.name"
K8S_JOB_NAME = "k8s.job.name"

# CUDA call spans (ours).
GPU_CUDA_CALL = "gpu.cuda.call"  # e.g. cudaLaunchKernel
GPU_CUDA_RETURN_CODE = "gpu.cuda.return_code"
# HIP call spans (ours, beside OBI's gpu.cuda.*; docs/spans-and-metrics.md says why). Every
# other call attribute (gpu.kernel.*, gpu.grid, gpu.memcpy.*, ...) is the same for both vendors.
GPU_HIP_CALL = "gpu.hip.call"  # e.g. hipLaunchKernel
GPU_HIP_RETURN_CODE = "gpu.hip.return_code"  # its hipError_t
GPU_KERNEL_NAME = "gpu.kernel.name"
GPU_KERNEL_FUNC = "gpu.kernel.func"  # raw function pointer/handle, hex
GPU_GRID = "gpu.grid"  # [x, y, z]
GPU_BLOCK = "gpu.block"
GPU_SHARED_MEMORY_BYTES = "gpu.shared_memory.bytes"
GPU_STREAM = "gpu.stream"
GPU_MEMCPY_BYTES = "gpu.memcpy.bytes"
GPU_MEMCPY_DIRECTION = "gpu.memcpy.direction"  # h2h, h2d, d2h, d2d, default
GPU_ALLOC_BYTES = "gpu.alloc.bytes"
# NCCL collectives and send/recv (ours, after the NCCL names; otel_gpu/probes/nccl.py).
GPU_NCCL_OP = "gpu.nccl.op"                # all_reduce, all_gather, reduce_scatter, broadcast, reduce, send, recv
GPU_NCCL_COUNT = "gpu.nccl.count"          # elements as passed (all_gather: sendcount; reduce_scatter: recvcount)
GPU_NCCL_BYTES = "gpu.nccl.bytes"          # bytes this rank receives (send: sends); all_gather: sendcount x nranks
GPU_NCCL_DATATYPE = "gpu.nccl.datatype"    # float32, bfloat16, ...
GPU_NCCL_REDUCTION = "gpu.nccl.reduction"  # sum, prod, max, min, avg, custom
GPU_NCCL_ROOT = "gpu.nccl.root"            # broadcast, reduce
GPU_NCCL_PEER = "gpu.nccl.peer"            # send, recv
GPU_NCCL_COMM = "gpu.nccl.comm"            # ncclComm_t, hex
GPU_NCCL_COMM_NRANKS = "gpu.nccl.comm.nranks"  # when its init was seen
GPU_NCCL_COMM_RANK = "gpu.nccl.comm.rank"
GPU_NCCL_GROUP = "gpu.nccl.group"          # calls of one ncclGroupStart/End share it (hex)
# A CUDA graph launch (ours): the kernels its capture recorded (pipeline/graphs.py), names
# (gpu.kernel.func hex where unnamed) with aligned counts per launch, and their sum.
GPU_GRAPH_KERNELS = "gpu.graph.kernels"              # string[]
GPU_GRAPH_KERNEL_COUNTS = "gpu.graph.kernel_counts"  # int[], aligned with gpu.graph.kernels
GPU_GRAPH_KERNEL_NODES = "gpu.graph.kernel_nodes"    # kernels one launch runs
GPU_ROLLUP_COUNT = "gpu.rollup.count"  # calls folded into one rollup child
GPU_ROLLUP_BYTES = "gpu.rollup.bytes"
GPU_ROLLUP_DURATION_NS = "gpu.rollup.duration_ns"
GPU_TIMING = "gpu.timing"  # always "host_enqueue": spans show host-side call time
# Device-clock mode (pipeline/device_times.py), on a launch, copy or graph launch span: from
# the call's entry to when the device began its work, and how long the device ran it (a graph
# launch: the union of its kernels', with how many kernels the device ran for it).
GPU_DEVICE_QUEUE_NS = "otel_gpu.device.queue_ns"
GPU_DEVICE_DURATION_NS = "otel_gpu.device.duration_ns"
GPU_DEVICE_KERNELS = "otel_gpu.device.kernels"
# The probe could not read an argument from the process's memory (a launch config, a
# stack argument): the values that come from it (grid, block, shared memory, stream,
# memcpy direction) are left out rather than exported as 0.
GPU_ARGS_UNREADABLE = "gpu.cuda.args_unreadable"
# An integer attribute was >= 2^63 (OTLP ints are int64): exported as 2^63-1, and this set.
GPU_VALUE_CLAMPED = "otel_gpu.value_clamped"

# How a CUDA call was tied to a request: task, thread, process, ambiguous, shared, outside.
GPU_ATTRIBUTION = "otel_gpu.attribution"
GPU_CANDIDATE_REQUESTS = "otel_gpu.candidate_requests"
# On a batch step's link to a request: how it was found in the batch (pipeline/steps.py):
# batch_member (it wrote a response chunk after the step) or overlap (open, nothing written yet).
GPU_LINK_RULE = "otel_gpu.link.rule"
# On a server span: the writes that carried its response body (a streamed token each, for SSE).
GPU_RESPONSE_CHUNKS = "otel_gpu.response.chunks"
# Connections of the process the kernel could not track (its table was full) while this
# span's calls were made: requests on them were not seen, so these calls may be theirs.
GPU_CONNECTIONS_UNTRACKED = "otel_gpu.connections.untracked"
# Records of the process's connections lost while this request was open (the ring buffer
# was full): those requests have no span (the kernel counted them in
# http.server.request.duration, with otel_gpu.request.summarised), so these calls may be theirs.
GPU_RECORDS_LOST = "otel_gpu.records_lost"
# The request began before its process's CUDA probes were attached (they attach when the
# collector finds the process: within a second of it loading CUDA, or of the collector
# starting): its CUDA calls before then were not seen, so its GPU summary and children
# may fall short of what it did.
GPU_CALLS_BEFORE_PROBES = "otel_gpu.calls.before_probes"
# On http.server.request.duration: requests the kernel summarised because records of
# theirs were lost (count and duration only: no route, method or status).
GPU_REQUEST_SUMMARISED = "otel_gpu.request.summarised"

# GPU summary on the server span (ours).
GPU_LAUNCHES = "gpu.launches"
GPU_MEMCPY_H2D_BYTES = "gpu.memcpy.h2d.bytes"
GPU_MEMCPY_D2H_BYTES = "gpu.memcpy.d2h.bytes"
GPU_MEMCPY_D2D_BYTES = "gpu.memcpy.d2d.bytes"
GPU_MEMCPY_OTHER_BYTES = "gpu.memcpy.other.bytes"
GPU_SYNC_DURATION_NS = "gpu.sync.duration_ns"
GPU_DISTINCT_KERNELS = "gpu.kernels.distinct"
# Kernels the request's graph launches ran (each graph launch is 1 in gpu.launches; its
# kernels count here): only when any.
GPU_GRAPH_KERNEL_LAUNCHES = "gpu.graph.kernel_launches"
GPU_CALLS = "gpu.calls"
GPU_NCCL_CALLS = "gpu.nccl.calls"  # NCCL collectives and send/recv (only when any)
GPU_NCCL_TOTAL_BYTES = "gpu.nccl.total_bytes"  # their gpu.nccl.bytes summed
# A double: each ambiguous call adds 1/N to each of its N candidate requests, so the
# sum over server spans is the number of ambiguous calls (never more).
GPU_CALLS_AMBIGUOUS = "otel_gpu.calls.ambiguous"
GPU_SPANS_DROPPED = "otel_gpu.spans.rolled_up"  # calls beyond the span budget

# GPU cost estimate (ours) on server spans and on ambiguous/shared/outside window spans:
# host-side busy-window model, see docs/cost-model.md.
GPU_COST_SECONDS = "otel_gpu.cost.gpu_seconds"
GPU_COST_AMOUNT = "otel_gpu.cost.amount"      # gpu_seconds x price per GPU-hour / 3600
GPU_COST_CURRENCY = "otel_gpu.cost.currency"  # e.g. USD
# Where gpu_seconds came from (pipeline/cost.py): host_window (the busy-window model) or device
# (device-clock mode: the union of the request's device intervals, shared stretches split).
GPU_COST_SOURCE = "otel_gpu.cost.source"
# true: the span left before its cost was settled (a request overlapping it was still open);
# the cost follows in the otel_gpu.cost.* metrics and the local store.
GPU_COST_PENDING = "otel_gpu.cost.pending"
GPU_FEATURE = "otel_gpu.feature"              # what cost is grouped by: http.route by default
# Where a request's time went (pipeline/time_split.py), seconds, on its server span: its serving
# thread on the CPU, runnable waiting for a CPU, off the CPU inside a synchronising GPU call,
# off the CPU otherwise; they add up to the span's duration. Absent: not split.
GPU_TIME_ON_CPU = "otel_gpu.time.on_cpu"
GPU_TIME_CPU_WAIT = "otel_gpu.time.cpu_wait"
GPU_TIME_GPU_SYNC = "otel_gpu.time.gpu_sync"
GPU_TIME_BLOCKED = "otel_gpu.time.blocked"
# true: the split is the serving thread's, which served other requests meanwhile or whose
# request's calls ran on other threads too (an asyncio loop, a worker pool): not its own alone.
GPU_TIME_SHARED = "otel_gpu.time.shared"
GPU_TIME_PART = "otel_gpu.time.part"  # metric label: on_cpu, cpu_wait, gpu_sync, blocked
# Seconds a request of a batching engine waited before the first batch step it was in
# (pipeline/steps.py): for a streamed response (a chunk after each step), where that step
# was decided before its span went out.
GPU_TIME_QUEUED = "otel_gpu.time.queued"
GPU_DEVICE = "gpu.device"                     # device ordinal (cudaSetDevice) of the request's work
# The physical GPU that ordinal names, where certain (otel_gpu/gpu_devices.py): ours, after gpu.device.
GPU_DEVICE_UUID = "gpu.device.uuid"           # "GPU-..." from the NVIDIA or amdgpu driver
GPU_DEVICE_MODEL = "gpu.device.model"         # "NVIDIA H100 80GB HBM3"

# Metric labels named as the OpenTelemetry eBPF Instrumentation (OBI) names them, on the metrics
# that mean what OBI's do (export/metrics.py), so that OBI's dashboards work on ours.
CUDA_DEVICE_INDEX = "cuda.device.index"       # the device ordinal, as gpu.device on spans
CUDA_DEVICE_UUID = "cuda.device.uuid"         # as gpu.device.uuid on spans
CUDA_DEVICE_MODEL = "cuda.device.model"       # as gpu.device.model on spans
CUDA_MEMCPY_KIND = "cuda.memcpy.kind"         # HostToHost, HostToDevice, DeviceToHost, DeviceToDevice, Default
# The same labels on the gpu.hip.* metrics, and on a request's metrics whose device is a HIP ordinal.
HIP_DEVICE_INDEX = "hip.device.index"
HIP_DEVICE_UUID = "hip.device.uuid"
HIP_DEVICE_MODEL = "hip.device.model"
HIP_MEMCPY_KIND = "hip.memcpy.kind"

# On an ambiguous or shared window's span: its GPU seconds split among the candidate requests by
# how long each was open during the window's busy time; lists aligned with the links.
GPU_COST_SPLIT_SECONDS = "otel_gpu.cost.split.gpu_seconds"  # double[]
GPU_COST_SPLIT_FEATURES = "otel_gpu.cost.split.features"     # string[]: each candidate's feature
GPU_COST_SPLIT_REST_SECONDS = "otel_gpu.cost.split.rest.gpu_seconds"  # double[]: the dropped links' shares, by feature
GPU_COST_SPLIT_REST_FEATURES = "otel_gpu.cost.split.rest.features"    # string[]: those features, one each
GPU_COST_SHARE = "otel_gpu.cost.share"  # metric label: exact (a request's own), split, outside

# (call, return code) attribute names by the call's API (cuda_calls.CallSpec.api).
CALL_ATTRIBUTES = {"cuda": (GPU_CUDA_CALL, GPU_CUDA_RETURN_CODE), "hip": (GPU_HIP_CALL, GPU_HIP_RETURN_CODE)}
# Metric labels by API: (device index, uuid, model) and the copy direction.
DEVICE_LABELS = {"cuda": (CUDA_DEVICE_INDEX, CUDA_DEVICE_UUID, CUDA_DEVICE_MODEL),
                 "hip": (HIP_DEVICE_INDEX, HIP_DEVICE_UUID, HIP_DEVICE_MODEL)}
MEMCPY_KIND_LABELS = {"cuda": CUDA_MEMCPY_KIND, "hip": HIP_MEMCPY_KIND}
# The time split's attributes in time_split.PARTS order.
TIME_ATTRIBUTES = (GPU_TIME_ON_CPU, GPU_TIME_CPU_WAIT, GPU_TIME_GPU_SYNC, GPU_TIME_BLOCKED)
