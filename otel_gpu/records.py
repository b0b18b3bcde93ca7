"""The records that flow through the pipeline, in the order the stages see them.

From the reader: socket events (Accept, SockIo, SockClose), one record per CUDA call
in the shape of its category (LaunchCall, MemcpyCall, ...), ProcExit, KernelRollup
(calls counted in the kernel while no request could be open) and Tick (time passing:
the collector's flush interval, or the final one at shutdown). The stitcher turns
them into Request / ProcessWindow (pipeline/model.py) plus ProcessSeen / ProcessGone.
Plain slotted dataclasses: cheap to build on the hot path."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional, Union

from .cuda_calls import BY_ID, CallSpec, call_name

EV_SOCK_READ, EV_SOCK_WRITE = 2, 3  # SockIo.kind (the event kinds of bpf/events.h)


@dataclass(slots=True)
class Accept:
    tgid: int
    tid: int
    ts_ns: int
    fd: int
    listen_fd: int
    peer_addr: Optional[str]
    peer_port: Optional[int]
    tracked: bool = True  # False: the kernel's connection table was full (its I/O is not seen)
    server_port: Optional[int] = None  # the listening socket's port, from /proc (pipeline/proc_facts.py)
    own: bool = False  # its peer is the collector's own socket (its export): never traced (own_sockets.py)
    again: bool = False  # sent again, marked own, once found ours after it (pipeline/proc_facts.py)
    inode: Optional[int] = None  # its socket's inode number (the kernel's fd_ino, or /proc's for a seed)


@dataclass(slots=True)
class SockIo:
    kind: int  # EV_SOCK_READ or EV_SOCK_WRITE
    tgid: int
    tid: int
    ts_ns: int
    fd: int
    ret: int
    data: bytes
    tail: bytes
    ctx: int = 0  # the execution unit running on the thread (a Python context, a goroutine), 0: none/unknown
    epoch: int = 0  # the process's HTTP epoch after this record (bpf/maps.h epoch_submit)
    tls: bool = False  # TLS plaintext from the SSL probes (bpf/tls_probes.c), not the syscall's bytes
    # The connection's records lost just before this one (ring buffer full): the kernel
    # summarised the requests they belonged to (RequestSummary).
    lost: int = 0
    req_start: bool = False  # a read that starts an HTTP/1 request as the kernel delimits them
    # Its first read's draw, where the kernel samples (bpf/head_sampling.c): a root
    # request's trace id takes it as its low 64 bits, so both decide alike. 0: none.
    draw: int = 0
    # An HTTP/2 connection's transfer as the kernel walked its frames (then `data` holds
    # the digest's leading bytes, those from the transfer's start); None: `data` is the copy.
    digest: Optional["H2Digest"] = None
    # Its thread's time so far, ns: (on CPU, waiting for a CPU, in a GPU sync, blocked)
    # (bpf/thread_times.c); None: the thread was not known to the sched probes.
    times: Optional[tuple] = None


@dataclass(slots=True)
class H2Digest:
    """One record of an HTTP/2 transfer as the kernel's frame walk gives it
    (bpf/h2_walk.c): `pieces`, (offset in the transfer, bytes), hold every frame header and
    the payloads parsing needs; the bytes between them are other payloads (DATA...).
    `more`: further records of the same transfer follow. `stop`: why the kernel stopped
    walking this direction for good (bpf/events.h H2_STOP_*); 0: it did not."""
    pieces: tuple
    more: bool = False
    stop: int = 0


@dataclass(slots=True)
class SockClose:
    tgid: int
    tid: int
    ts_ns: int
    fd: int
    epoch: int = 0  # as SockIo.epoch
    lost: int = 0   # as SockIo.lost
    inode: Optional[int] = None  # its socket's inode number, where the kernel knew it


@dataclass(slots=True)
class ProcExit:
    tgid: int
    ts_ns: int
    comm: str = ""


# GPU activity kinds of a DeviceActivity (cupti/device_record.h).
DEVICE_KERNEL, DEVICE_MEMCPY, DEVICE_MEMSET = 1, 2, 3


@dataclass(slots=True)
class DeviceActivity:
    """A kernel, memcpy or memset as the device timed it, from device-clock mode's library
    (cupti/device_record.h): times on CLOCK_MONOTONIC, like every ts_ns here."""
    kind: int            # DEVICE_KERNEL, DEVICE_MEMCPY or DEVICE_MEMSET
    start_ns: int
    end_ns: int
    api_ns: int          # when the launching API call entered; 0: not known
    tid: int             # the launching thread; 0: not known
    api: tuple           # (CUPTI callback domain, callback id) of the launching call; (0, 0): not known
    correlation_id: int
    stream_id: int
    device_id: int
    bytes: int = 0


@dataclass(slots=True)
class DeviceRecords:
    """One hand-off of the device-clock library (bpf/device_records.c): its activities, and
    how many it says did not arrive intact since the one before."""
    tgid: int
    ts_ns: int
    activities: tuple
    dropped: int
    unreadable: bool = False  # the batch could not be read from the process: activities are ()


@dataclass(slots=True)
class LibraryLoaded:
    """A process entered the kernel's `loaded` table (bpf/library_probes.c): the ring reader
    takes it as the cue to read that table; it never reaches the pipeline."""
    tgid: int


@dataclass(slots=True)
class DeviceClockSeen:
    """A traced process maps the device-clock library (probes/discovery.py): its streamed
    calls are kept from now for the device records that will time them."""
    tgid: int


# --- CUDA calls: one class per event shape; `call` is the table id (cuda_calls.py).
@dataclass(slots=True)
class CudaCall:
    tgid: int
    tid: int
    ts_ns: int
    call: int
    ret: int  # return code; -1 where the call has no return probe
    # The Python contextvars.Context the calling thread was running (its id()), read
    # from the thread's PyThreadState; 0 when not a Python thread or not known.
    ctx: int = field(default=0, kw_only=True)
    # The probe could not read an argument from the process's memory (bpf/events.h
    # EV_FLAG_UNREADABLE): the fields that come from memory are 0, not real values.
    unreadable: bool = field(default=False, kw_only=True)
    # Made while HTTP records of its process were lost and their connections had not yet
    # told so (bpf/events.h EV_FLAG_HTTP_UNSEEN): a request not seen may own it.
    http_unseen: bool = field(default=False, kw_only=True)
    # Device-clock mode (pipeline/device_times.py): ((start_ns, end_ns), ...) of the GPU work
    # it launched, as the device timed it (a graph launch: each kernel's); () until known.
    device_ns: tuple = field(default=(), kw_only=True)

    @property
    def spec(self) -> Optional[CallSpec]:
        return BY_ID.get(self.call)

    @property
    def name(self) -> str:
        return call_name(self.call)

    def amounts(self) -> tuple[int, int, int]:
        """(rollup detail, bytes, duration_ns): what a rollup of this call adds up.
        The detail means what cuda_calls.py ROLLUP_DETAIL says for the category."""
        return 0, 0, 0


@dataclass(slots=True)
class LaunchCall(CudaCall):
    func: int       # kernel function pointer (runtime) or CUfunction/CUkernel handle (driver)
    grid: tuple
    block: tuple
    shmem: int
    stream: int
    # Made while its process had a stream capture open (bpf/events.h EV_FLAG_CAPTURE):
    # pipeline/graphs.py keeps it out (recorded into a graph) if its stream was capturing.
    capture: bool = field(default=False, kw_only=True)

    def amounts(self) -> tuple[int, int, int]:
        return self.func, 0, 0


@dataclass(slots=True)
class MemcpyCall(CudaCall):
    bytes: int
    direction: int  # cudaMemcpyKind
    stream: int

    def amounts(self) -> tuple[int, int, int]:
        return self.direction, self.bytes, 0


@dataclass(slots=True)
class MemoryCall(CudaCall):
    ptr: int        # the allocated pointer (read at return) or the freed one
    bytes: int      # allocation size; 0 for a free
    duration_ns: int

    def amounts(self) -> tuple[int, int, int]:
        return self.ptr, self.bytes, self.duration_ns


@dataclass(slots=True)
class SyncCall(CudaCall):
    handle: int     # stream or event; 0 for cudaDeviceSynchronize
    duration_ns: int

    def amounts(self) -> tuple[int, int, int]:
        return 0, 0, self.duration_ns


@dataclass(slots=True)
class GraphCall(CudaCall):
    graph_exec: int
    stream: int
    # What the exec runs, from its capture (pipeline/graphs.py): ((kernel func, count), ...)
    # in first-launch order; None when its capture was not seen.
    kernels: Optional[tuple] = field(default=None, kw_only=True)

    def amounts(self) -> tuple[int, int, int]:
        return self.graph_exec, 0, 0


@dataclass(slots=True)
class DeviceCall(CudaCall):
    device: int

    def amounts(self) -> tuple[int, int, int]:
        return self.device, 0, 0


@dataclass(slots=True)
class NcclCall(CudaCall):
    """An NCCL collective or send/recv (bpf/nccl_probes.c); otel_gpu/probes/nccl.py names
    the codes. `bytes` is what this rank receives (send: sends), 0 for an unknown type."""
    count: int      # elements as passed (all_gather: sendcount; reduce_scatter: recvcount)
    bytes: int
    datatype: int   # ncclDataType_t
    redop: int      # ncclRedOp_t, or NCCL_NO_OP
    peer: int       # root (broadcast, reduce) or peer (send, recv); -1: none
    comm: int       # ncclComm_t
    nranks: int     # 0: the communicator's init was not seen
    rank: int       # -1: unknown
    stream: int
    group: int      # the ncclGroupStart that encloses it (its timestamp), 0: none

    def amounts(self) -> tuple[int, int, int]:
        return self.comm, self.bytes, 0


@dataclass(slots=True)
class ContextCopy:
    """A new execution unit `ctx`, made by `parent` (the unit running on the thread then):
    a Python process copied its contextvars.Context (PyContext_CopyCurrent: a new
    asyncio Task, call_soon, copy_context() before a worker thread runs code in it), or
    a Go process started a goroutine (`go f()`: GO_UNIT | goid for both)."""
    tgid: int
    tid: int
    ts_ns: int
    ctx: int
    parent: int
    epoch: int = 0  # the process's epoch after this record (bpf/maps.h epoch_submit)


@dataclass(slots=True)
class UnitWake:
    """Goroutine `waker` made goroutine `woken` runnable (a channel send, a mutex
    unlock): work handed from one to the other. The first time for each pair only."""
    tgid: int
    tid: int
    ts_ns: int
    woken: int
    waker: int
    epoch: int = 0  # as ContextCopy's


@dataclass(slots=True)
class GoH2Unit:
    """Goroutine `unit` began serverConn `conn`'s frame reader (stream 0) or the handler
    of its stream `stream` (Go's HTTP/2 server: bpf/go_probes.c)."""
    tgid: int
    tid: int
    ts_ns: int
    unit: int
    conn: int
    stream: int
    epoch: int = 0  # as ContextCopy's


@dataclass(slots=True)
class KernelHandle:
    """A call handed out a kernel handle (cuda_calls.py Category.NAME): later launches
    of `handle` run the kernel `name` (the mangled symbol asked for), or whatever
    `source` (a host stub or a CUkernel) names. Consumed by enrich, never a span."""
    tgid: int
    tid: int
    ts_ns: int
    call: int
    ret: int
    handle: int
    source: int              # 0 when a name came
    name: Optional[str]      # None when a source came
    cut: bool = False        # the name filled KERNEL_NAME_CAP: it may be cut short
    unreadable: bool = False  # the handle or the name could not be read: handle/name are 0/None


@dataclass(slots=True)
class GraphOp:
    """A CUDA graph's capture began or ended, a graph was instantiated, or a graph or
    exec destroyed (cuda_calls.py Category.GRAPH_OP; the call says which). Consumed by
    pipeline/graphs.py, never a span."""
    tgid: int
    tid: int
    ts_ns: int
    call: int
    ret: int
    stream: int
    graph: int
    graph_exec: int
    unreadable: bool = False


@dataclass(slots=True)
class CallAggregate:
    """Calls of one thread in one Python context (`ctx`) and HTTP epoch that the kernel
    counted instead of streaming (past the thread's budget, or the ring buffer near
    full: bpf/call_out.c req_agg), by (call, detail): the reader places it where
    the epoch ended, so it is attributed as the calls one by one would have been."""
    tgid: int
    tid: int
    epoch: int
    call: int
    detail: int
    ctx: int
    count: int
    bytes: int
    duration_ns: int
    ts_ns: int        # entry of the first call
    last_ts: int      # entry of the last
    last_end_ts: int  # latest end (a synchronising call's return)
    kernels: Optional[tuple] = None  # a graph launch's kernels (GraphCall.kernels)
    http_unseen: bool = False  # as CudaCall.http_unseen


@dataclass(slots=True)
class AggregateRun:
    """The CallAggregates of one thread, unit (`ctx`) and HTTP epoch that the reader put
    in one place, in time order: one record for the stages to pass on, however many
    kernels the thread launched, and one rule decision where their facts are the same
    (pipeline/attribution.py on_run)."""
    tgid: int
    tid: int
    epoch: int
    ctx: int
    http_unseen: bool
    aggregates: list  # [CallAggregate], sorted by ts_ns


# --- records that say something about time or processes -----------------------------
@dataclass(slots=True)
class KernelRollup:
    """Calls the BPF side counted (no request could be open), made between the previous
    read (`since_ns`, None for the first) and `now_ns`."""
    tgid: int
    call: int
    detail: int
    count: int
    bytes: int
    duration_ns: int
    now_ns: int
    since_ns: Optional[int] = None
    kernels: Optional[tuple] = None  # a graph launch's kernels (GraphCall.kernels)


@dataclass(slots=True)
class Tick:
    """The flush interval passed (windows and held requests go out), or, `final`, the
    collector is stopping (everything open is closed and goes out)."""
    now_ns: int
    final: bool = False


@dataclass(slots=True)
class RequestOpened:
    """A request began (its head was read): from the stitcher to the cost stage, which
    must know which open requests may still overlap the finished ones. Its busy window
    may open later, and even start before that (held calls land when it binds), but
    never before the request itself."""
    request: Any


@dataclass(slots=True)
class RequestCost:
    """A request's GPU cost, settled after its span left (pipeline/cost.py): from the
    cost stage to the cost metrics and the local store. `request` carries it, priced."""
    request: Any


@dataclass(slots=True)
class RequestSummary:
    """HTTP/1 requests of a process that the kernel summarised because records of theirs
    were lost (ring buffer full), since the last summary: (count, summed duration ns) by
    duration bucket (probes/summary_buckets.py BOUNDS_NS). Their spans and routes are
    gone; their number and durations are not."""
    tgid: int
    buckets: list  # [(count, sum_ns)], one per bucket
    resource: Any = None  # set by enrich


@dataclass(slots=True)
class ProcessSeen:
    """First event of a process: enrichment reads /proc while it still exists."""
    tgid: int
    # Traced as it was found, before its CUDA probes were attached (they attach then):
    # its calls before this time (BPF clock) were not seen. 0: probed before it ran.
    probes_from_ns: int = 0


@dataclass(slots=True)
class ProcessGroup:
    """The process's group of related processes (pipeline/groups.py key, None: none), from
    /proc, before any other record of the process reaches the stitcher."""
    tgid: int
    key: Optional[str]


@dataclass(slots=True)
class OpenSockets:
    """The sockets a process holds (fd -> socket inode; {} once it is gone), from /proc,
    for the stitcher's audit of connections whose close was never seen: every process
    with connections (`everyone`) now and then, those with untracked ones at each Tick."""
    tgid: int
    fds: dict
    everyone: bool
    now_ns: int  # the Tick's time


@dataclass(slots=True)
class ProcessGone:
    """A process exited; every record about it before this one has passed."""
    tgid: int
    comm: str = ""  # from the exit event: names a process /proc was never read for


Event = Union[Accept, SockIo, SockClose, CudaCall, CallAggregate, ContextCopy, UnitWake, ProcExit, KernelRollup,
              Tick]
