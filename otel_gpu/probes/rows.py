"""What is attached where, as data: the uprobe rows of every probed file (the GPU calls
of otel_gpu/cuda_calls.py's table, and the Python, Go, OpenSSL, NCCL-state and
device-clock probes), by the file's library (rows_for), and the tracepoints."""
from __future__ import annotations

from dataclasses import dataclass
from typing import Optional

from ..cuda_calls import (CALLS, BY_NAME, DEVICE_CLOCK, GO, HIP, NCCL, PYTHON, RUNTIME, RUNTIME_CALLS,
                          RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS, TLS, Category)


@dataclass(frozen=True)
class UprobeRow:
    library: str            # RUNTIME, DRIVER, NCCL, HIP, PYTHON, TLS, GO or DEVICE_CLOCK
    symbol: str
    entry: str              # BPF function run at entry
    ret: Optional[str] = None


CUDA_PROBES: tuple[UprobeRow, ...] = tuple(
    UprobeRow(c.library, sym, c.entry, c.ret) for c in CALLS for sym in c.symbols)
# The files whose probes see GPU calls (a routed runtime's calls too: probes/launch_routes.py).
CALL_LIBRARIES = frozenset(c.library for c in CALLS) | {RUNTIME_CALLS}
# The runtime's kernel and graph launch entries, and the learner run beside each kernel
# launch's (bpf/launch_routes.c; a graph's exec is the same handle for the driver).
RUNTIME_LAUNCH_PROBES, RUNTIME_GRAPH_LAUNCH_PROBES = (tuple(
    UprobeRow(c.library, sym, c.entry, c.ret) for c in CALLS if c.library == RUNTIME
    and c.category is category for sym in c.symbols) for category in (Category.LAUNCH, Category.GRAPH))
LEARNERS = {"cuda_launch_kernel": "runtime_launch_learn", "cuda_launch_kernel_exc": "runtime_launch_exc_learn"}

# HIP's graph capture has the CUDA runtime's ABI (hipStreamBeginCapture(stream, mode),
# hipStreamEndCapture(stream, hipGraph_t *), hipGraphInstantiate(exec *, graph, ...), and
# hipErrorStreamCaptureInvalidated is 901 as in CUDA), and graph ops are never spans of their
# own (pipeline/graphs.py): the CUDA runtime's handlers serve them, and a HIP capture's kernels
# reach its hipGraphLaunch as a CUDA capture's reach cudaGraphLaunch.
HIP_GRAPH_PROBES: tuple[UprobeRow, ...] = tuple(
    UprobeRow(HIP, symbol, BY_NAME[cuda].entry, BY_NAME[cuda].ret) for symbol, cuda in (
        ("hipStreamBeginCapture", "cudaStreamBeginCapture"), ("hipStreamBeginCapture_spt", "cudaStreamBeginCapture"),
        ("hipStreamEndCapture", "cudaStreamEndCapture"), ("hipStreamEndCapture_spt", "cudaStreamEndCapture"),
        ("hipGraphInstantiate", "cudaGraphInstantiate"), ("hipGraphInstantiateWithFlags", "cudaGraphInstantiate"),
        ("hipGraphDestroy", "cudaGraphDestroy"), ("hipGraphExecDestroy", "cudaGraphExecDestroy")))

# The HTTP probes' tracepoints (bcc attaches the *_PROBE functions by itself; these lists
# are what `otel-gpu run` reports and the detach tests check): every syscall's exit, raw
# (a BPF link, no perf record; the syscalls followed: probes/syscalls.py), and
# process exit (a perf event).
HTTP_RAW_TRACEPOINTS: tuple[str, ...] = ("raw_syscalls:sys_exit",)
HTTP_TRACEPOINTS: tuple[str, ...] = ("sched:sched_process_exit",)
# bpf/graph_probes.c's process exit, raw (http_syscalls.c holds the perf event's program name).
GRAPH_RAW_TRACEPOINTS: tuple[str, ...] = ("sched:sched_process_exit",)

# The open syscalls' tracepoints of bpf/library_probes.c: a CUDA library opened at any path;
# and, raw, every exec on the host (the processes discovery reads again).
LIBRARY_TRACEPOINTS: tuple[str, ...] = ("syscalls:sys_enter_openat", "syscalls:sys_enter_open")
LIBRARY_RAW_TRACEPOINTS: tuple[str, ...] = ("sched:sched_process_exec",)

# The sched tracepoint of bpf/sched_probes.c, raw (a BPF link, no perf record): each traced
# thread's time per state (the time split).
SCHED_TRACEPOINTS: tuple[str, ...] = ("sched:sched_switch",)


# The Python execution-context probe (bpf/python_probes.c), an exported symbol: each
# contextvars.Context copy (the return value). A thread's running context is read at
# the CUDA or socket call, with no probe.
PYTHON_PROBES: tuple[UprobeRow, ...] = (
    UprobeRow(PYTHON, "PyContext_CopyCurrent", "py_copy_context_enter", "py_copy_context_return"),
)


# The Go runtime probes (bpf/go_probes.c), at addresses from .gopclntab (stripped
# binaries too: probes/go_functions.py): which goroutine started which, and hand-offs;
# and the goroutines of Go's HTTP/2 server, wherever its package lives in that release.
GO_H2_PACKAGES = ("net/http.(*http2serverConn)", "net/http/internal/http2.(*serverConn)",
                  "golang.org/x/net/http2.(*serverConn)")
GO_PROBES: tuple[UprobeRow, ...] = (
    UprobeRow(GO, "runtime.newproc1", "go_newproc1"),
    UprobeRow(GO, "runtime.runqput", "go_runqput"),
) + tuple(UprobeRow(GO, f"{package}.{function}", probe) for package in GO_H2_PACKAGES
          for function, probe in (("readFrames", "go_h2_reader"), ("runHandler", "go_h2_handler")))


# NCCL state, not calls of their own (bpf/nccl_probes.c): the thread's group nesting, and
# each communicator's size and rank (learnt at the return of its init, forgotten at its end).
NCCL_STATE_PROBES: tuple[UprobeRow, ...] = (
    UprobeRow(NCCL, "ncclGroupStart", "nccl_group_start"),
    UprobeRow(NCCL, "ncclGroupEnd", "nccl_group_end"),
    UprobeRow(NCCL, "ncclCommInitRank", "nccl_comm_init_rank", "nccl_comm_init_rank_return"),
    UprobeRow(NCCL, "ncclCommInitRankConfig", "nccl_comm_init_rank", "nccl_comm_init_rank_return"),
    UprobeRow(NCCL, "ncclCommInitAll", "nccl_comm_init_all", "nccl_comm_init_all_return"),
    UprobeRow(NCCL, "ncclCommDestroy", "nccl_comm_end"),
    UprobeRow(NCCL, "ncclCommAbort", "nccl_comm_end"),
)


# The OpenSSL probes (bpf/tls_probes.c): the SSL* and buffer at entry, the count at
# return; the handshake ties a socket to its SSL*, SSL_free forgets the tie. Where the
# file proves that its reads and writes go through one internal function each
# (probes/tls_entries.py: addresses from the code), those two take the place of the four
# public entries (TLS_THROUGH), which x86 would single-step.
TLS_INTERNAL_PROBES: tuple[UprobeRow, ...] = (
    UprobeRow(TLS, "ssl_read_internal", "tls_read_ex_enter", "tls_read_return"),
    UprobeRow(TLS, "ssl_write_internal", "tls_write_ex_enter", "tls_write_return"),
)
TLS_THROUGH = frozenset(("SSL_read", "SSL_read_ex", "SSL_write", "SSL_write_ex"))
TLS_PROBES: tuple[UprobeRow, ...] = (
    UprobeRow(TLS, "SSL_read", "tls_read_enter", "tls_read_return"),
    UprobeRow(TLS, "SSL_read_ex", "tls_read_ex_enter", "tls_read_return"),
    UprobeRow(TLS, "SSL_write", "tls_write_enter", "tls_write_return"),
    UprobeRow(TLS, "SSL_write_ex", "tls_write_ex_enter", "tls_write_return"),
    UprobeRow(TLS, "SSL_do_handshake", "tls_handshake_enter", "tls_handshake_return"),
    UprobeRow(TLS, "SSL_free", "tls_free"),
)


# Device-clock mode (otel_gpu/device_clock): the injection library's hand-off of its records.
DEVICE_CLOCK_PROBES: tuple[UprobeRow, ...] = (
    UprobeRow(DEVICE_CLOCK, "otel_gpu_device_records", "device_records"),
)


def rows_for(library: str, addresses: tuple = ()) -> list[UprobeRow]:
    """The rows to attach to a file of `library`; `addresses`: (symbol, address) the file's
    code gave (probes/discovery.py ProbeTarget)."""
    if library == PYTHON:
        return list(PYTHON_PROBES)
    if library == TLS:
        known = dict(addresses)
        if all(r.symbol in known for r in TLS_INTERNAL_PROBES):
            return list(TLS_INTERNAL_PROBES) + [r for r in TLS_PROBES if r.symbol not in TLS_THROUGH]
        return list(TLS_PROBES)
    if library == GO:
        return list(GO_PROBES)
    if library == DEVICE_CLOCK:
        return list(DEVICE_CLOCK_PROBES)
    if library == NCCL:
        return [r for r in CUDA_PROBES if r.library == NCCL] + list(NCCL_STATE_PROBES)
    if library == HIP:
        return [r for r in CUDA_PROBES if r.library == HIP] + list(HIP_GRAPH_PROBES)
    if library == RUNTIME_CALLS:
        return [r for r in CUDA_PROBES if r.library == RUNTIME and r not in RUNTIME_LAUNCH_PROBES
                and r not in RUNTIME_GRAPH_LAUNCH_PROBES]
    if library == RUNTIME_LAUNCHES:
        return list(RUNTIME_LAUNCH_PROBES)
    if library == RUNTIME_GRAPH_LAUNCHES:
        return list(RUNTIME_GRAPH_LAUNCH_PROBES)
    if library == RUNTIME_LEARNERS:
        return [UprobeRow(RUNTIME, r.symbol, LEARNERS[r.entry]) for r in RUNTIME_LAUNCH_PROBES
                if r.entry in LEARNERS]
    return [r for r in CUDA_PROBES if r.library == library]
