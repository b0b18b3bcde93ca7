"""Pins every attribute name in otel_gpu.semconv: renaming one breaks dashboards and
queries downstream, so any change (or a new, unpinned name) must show up here."""
import re

from otel_gpu import semconv

PINNED = {
    "CLIENT_ADDRESS": "client.address",
    "CLIENT_PORT": "client.port",
    "CONTAINER_ID": "container.id",
    "ERROR_TYPE": "error.type",
    "GPU_ALLOC_BYTES": "gpu.alloc.bytes",
    "RPC_GRPC_STATUS_CODE": "rpc.grpc.status_code",
    "RPC_METHOD": "rpc.method",
    "RPC_SERVICE": "rpc.service",
    "RPC_SYSTEM": "rpc.system",
    "GPU_ARGS_UNREADABLE": "gpu.cuda.args_unreadable",
    "GPU_ATTRIBUTION": "otel_gpu.attribution",
    "GPU_BLOCK": "gpu.block",
    "GPU_CALLS": "gpu.calls",
    "GPU_CALLS_AMBIGUOUS": "otel_gpu.calls.ambiguous",
    "GPU_CANDIDATE_REQUESTS": "otel_gpu.candidate_requests",
    "GPU_CONNECTIONS_UNTRACKED": "otel_gpu.connections.untracked",
    "GPU_RECORDS_LOST": "otel_gpu.records_lost",
    "GPU_CALLS_BEFORE_PROBES": "otel_gpu.calls.before_probes",
    "GPU_REQUEST_SUMMARISED": "otel_gpu.request.summarised",
    "GPU_CUDA_CALL": "gpu.cuda.call",
    "GPU_CUDA_RETURN_CODE": "gpu.cuda.return_code",
    "GPU_HIP_CALL": "gpu.hip.call",
    "GPU_HIP_RETURN_CODE": "gpu.hip.return_code",
    "GPU_DISTINCT_KERNELS": "gpu.kernels.distinct",
    "GPU_GRAPH_KERNELS": "gpu.graph.kernels",
    "GPU_GRAPH_KERNEL_COUNTS": "gpu.graph.kernel_counts",
    "GPU_GRAPH_KERNEL_LAUNCHES": "gpu.graph.kernel_launches",
    "GPU_GRAPH_KERNEL_NODES": "gpu.graph.kernel_nodes",
    "GPU_GRID": "gpu.grid",
    "GPU_KERNEL_FUNC": "gpu.kernel.func",
    "GPU_KERNEL_NAME": "gpu.kernel.name",
    "GPU_NCCL_BYTES": "gpu.nccl.bytes",
    "GPU_NCCL_CALLS": "gpu.nccl.calls",
    "GPU_NCCL_COMM": "gpu.nccl.comm",
    "GPU_NCCL_COMM_NRANKS": "gpu.nccl.comm.nranks",
    "GPU_NCCL_COMM_RANK": "gpu.nccl.comm.rank",
    "GPU_NCCL_COUNT": "gpu.nccl.count",
    "GPU_NCCL_DATATYPE": "gpu.nccl.datatype",
    "GPU_NCCL_GROUP": "gpu.nccl.group",
    "GPU_NCCL_OP": "gpu.nccl.op",
    "GPU_NCCL_PEER": "gpu.nccl.peer",
    "GPU_NCCL_REDUCTION": "gpu.nccl.reduction",
    "GPU_NCCL_ROOT": "gpu.nccl.root",
    "GPU_NCCL_TOTAL_BYTES": "gpu.nccl.total_bytes",
    "GPU_LAUNCHES": "gpu.launches",
    "GPU_MEMCPY_BYTES": "gpu.memcpy.bytes",
    "GPU_MEMCPY_D2D_BYTES": "gpu.memcpy.d2d.bytes",
    "GPU_MEMCPY_D2H_BYTES": "gpu.memcpy.d2h.bytes",
    "GPU_MEMCPY_DIRECTION": "gpu.memcpy.direction",
    "GPU_MEMCPY_H2D_BYTES": "gpu.memcpy.h2d.bytes",
    "GPU_MEMCPY_OTHER_BYTES": "gpu.memcpy.other.bytes",
    "GPU_ROLLUP_BYTES": "gpu.rollup.bytes",
    "GPU_ROLLUP_COUNT": "gpu.rollup.count",
    "GPU_ROLLUP_DURATION_NS": "gpu.rollup.duration_ns",
    "GPU_SHARED_MEMORY_BYTES": "gpu.shared_memory.bytes",
    "GPU_SPANS_DROPPED": "otel_gpu.spans.rolled_up",
    "GPU_STREAM": "gpu.stream",
    "GPU_SYNC_DURATION_NS": "gpu.sync.duration_ns",
    "GPU_TIMING": "gpu.timing",
    "GPU_DEVICE_QUEUE_NS": "otel_gpu.device.queue_ns",
    "GPU_DEVICE_DURATION_NS": "otel_gpu.device.duration_ns",
    "GPU_DEVICE_KERNELS": "otel_gpu.device.kernels",
    "GPU_VALUE_CLAMPED": "otel_gpu.value_clamped",
    "HOST_NAME": "host.name",
    "HTTP_REQUEST_METHOD": "http.request.method",
    "HTTP_RESPONSE_STATUS_CODE": "http.response.status_code",
    "HTTP_ROUTE": "http.route",
    "K8S_CONTAINER_NAME": "k8s.container.name",
    "K8S_DAEMONSET_NAME": "k8s.daemonset.name",
    "K8S_DEPLOYMENT_NAME": "k8s.deployment.name",
    "K8S_JOB_NAME": "k8s.job.name",
    "K8S_NAMESPACE_NAME": "k8s.namespace.name",
    "K8S_NODE_NAME": "k8s.node.name",
    "K8S_POD_NAME": "k8s.pod.name",
    "K8S_POD_UID": "k8s.pod.uid",
    "K8S_REPLICASET_NAME": "k8s.replicaset.name",
    "K8S_STATEFULSET_NAME": "k8s.statefulset.name",
    "NETWORK_PROTOCOL_VERSION": "network.protocol.version",
    "PROCESS_COMMAND_LINE": "process.command_line",
    "PROCESS_EXECUTABLE_NAME": "process.executable.name",
    "PROCESS_EXECUTABLE_PATH": "process.executable.path",
    "PROCESS_PID": "process.pid",
    "SERVER_PORT": "server.port",
    "SERVICE_NAME": "service.name",
    "THREAD_ID": "thread.id",
    "URL_PATH": "url.path",
    "URL_QUERY": "url.query",
    "URL_SCHEME": "url.scheme",
    "GPU_COST_SECONDS": "otel_gpu.cost.gpu_seconds",
    "GPU_COST_AMOUNT": "otel_gpu.cost.amount",
    "GPU_COST_CURRENCY": "otel_gpu.cost.currency",
    "GPU_COST_SOURCE": "otel_gpu.cost.source",
    "GPU_COST_PENDING": "otel_gpu.cost.pending",
    "GPU_FEATURE": "otel_gpu.feature",
    "GPU_DEVICE": "gpu.device",
    "GPU_DEVICE_MODEL": "gpu.device.model",
    "GPU_DEVICE_UUID": "gpu.device.uuid",
    "CUDA_DEVICE_INDEX": "cuda.device.index",
    "CUDA_DEVICE_UUID": "cuda.device.uuid",
    "CUDA_DEVICE_MODEL": "cuda.device.model",
    "CUDA_MEMCPY_KIND": "cuda.memcpy.kind",
    "HIP_DEVICE_INDEX": "hip.device.index",
    "HIP_DEVICE_UUID": "hip.device.uuid",
    "HIP_DEVICE_MODEL": "hip.device.model",
    "HIP_MEMCPY_KIND": "hip.memcpy.kind",
    "GPU_COST_SPLIT_SECONDS": "otel_gpu.cost.split.gpu_seconds",
    "GPU_COST_SPLIT_FEATURES": "otel_gpu.cost.split.features",
    "GPU_COST_SPLIT_REST_SECONDS": "otel_gpu.cost.split.rest.gpu_seconds",
    "GPU_COST_SPLIT_REST_FEATURES": "otel_gpu.cost.split.rest.features",
    "GPU_COST_SHARE": "otel_gpu.cost.share",
    "GPU_LINK_RULE": "otel_gpu.link.rule",
    "GPU_TIME_ON_CPU": "otel_gpu.time.on_cpu",
    "GPU_TIME_CPU_WAIT": "otel_gpu.time.cpu_wait",
    "GPU_TIME_GPU_SYNC": "otel_gpu.time.gpu_sync",
    "GPU_TIME_BLOCKED": "otel_gpu.time.blocked",
    "GPU_TIME_SHARED": "otel_gpu.time.shared",
    "GPU_TIME_PART": "otel_gpu.time.part",
    "GPU_TIME_QUEUED": "otel_gpu.time.queued",
    "GPU_RESPONSE_CHUNKS": "otel_gpu.response.chunks",
}


def _exported():
    return {k: v for k, v in vars(semconv).items() if not k.startswith("_") and isinstance(v, str)}


def test_every_name_is_pinned():
    assert _exported() == PINNED


def test_names_are_unique():
    assert len(set(PINNED.values())) == len(PINNED)


def test_names_are_dotted_lower_case():
    for name in PINNED.values():
        assert re.fullmatch(r"[a-z0-9_]+(\.[a-z0-9_]+)+", name), name


def test_own_names_live_under_gpu_or_otel_gpu():
    standard = ("http.", "url.", "server.", "client.", "network.", "error.", "process.", "thread.",
                "service.", "host.", "container.", "k8s.", "rpc.")
    for const, name in PINNED.items():
        if const.startswith("GPU_"):
            assert name.startswith(("gpu.", "otel_gpu.")), const
        elif const.startswith("CUDA_"):  # the OpenTelemetry eBPF Instrumentation's metric labels
            assert name.startswith("cuda."), const
        elif const.startswith("HIP_"):  # the same labels of the gpu.hip.* metrics
            assert name.startswith("hip.") and PINNED["CUDA_" + const[4:]] == "cuda." + name[4:], const
        else:
            assert name.startswith(standard), const
