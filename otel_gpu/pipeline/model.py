"""What the stitcher hands on: finished requests and per-process windows of CUDA
calls that belong to no single request. Cost and enrich fill in their fields; export
builds spans from them."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any, Optional

from ..cuda_calls import API_CUDA, API_OF, BY_ID, MEMCPY_DIRECTIONS, Category, ids_in
from ..device_clock.apis import ACTIVITY_OF
from ..records import CudaCall, GraphCall
from .protocols.base import RequestHead

# How a CUDA call was tied to a request.
TASK = "task"            # made in the Python context the request bound to, or one derived from it
THREAD = "thread"        # made on the thread that read the request, while it was open
PROCESS = "process"      # another thread, while the process had exactly one open request
AMBIGUOUS = "ambiguous"  # several requests open and the thread does not decide: not guessed
SHARED = "shared"        # none open in the process, but in a related one (pipeline/groups.py):
                         # a batch step for the requests in flight there, linked to all of them
OUTSIDE = "outside"      # no request open in the process, or made in a context no request owns
ATTRIBUTIONS = (TASK, THREAD, PROCESS, AMBIGUOUS, SHARED, OUTSIDE)

# Where a span's GPU seconds came from (otel_gpu.cost.source, set by pipeline/cost.py): the
# busy-window model's estimate, or, in device-clock mode, the device's clock for a request
# (or window) whose every launch and copy the device timed (pipeline/device_times.py).
HOST_WINDOW, DEVICE = "host_window", "device"


MAX_CHUNK_TIMES = 4096  # response-write times kept per request (a few seconds of steps)


@dataclass
class RollupAgg:
    """Calls folded together, by (call, detail): counts always add up. The detail is
    what cuda_calls.py ROLLUP_DETAIL says for the call's category."""
    call: int
    detail: int
    count: int = 0
    bytes: int = 0
    duration_ns: int = 0
    first_ts: int = 0
    last_ts: int = 0
    last_end_ts: int = 0
    kernels: Optional[tuple] = None  # a graph launch's ((kernel func, count), ...): pipeline/graphs.py

    def add(self, c: CudaCall, nbytes: int, duration_ns: int) -> None:
        if not self.count:
            self.first_ts = c.ts_ns
        self.count += 1
        self.bytes += nbytes
        self.duration_ns += duration_ns
        self.last_ts = c.ts_ns
        self.last_end_ts = max(self.last_end_ts, c.ts_ns + duration_ns)

    @classmethod
    def counted(cls, a) -> "RollupAgg":
        """The calls of one kernel count (a CallAggregate: req_agg's entry), a graph
        launch's kernels with them."""
        return cls(a.call, a.detail, a.count, a.bytes, a.duration_ns, a.ts_ns, a.last_ts, a.last_end_ts, a.kernels)

    def copy(self) -> "RollupAgg":
        """dataclasses.replace without its field-by-field introspection: once per request."""
        return RollupAgg(self.call, self.detail, self.count, self.bytes, self.duration_ns, self.first_ts,
                         self.last_ts, self.last_end_ts, self.kernels)


# Call id -> the category a request summary counts it by (None: only in `calls`).
_SUMMARY_KIND = {c.id: c.category for c in BY_ID.values()
                 if c.category in (Category.LAUNCH, Category.GRAPH, Category.MEMCPY, Category.SYNC,
                                   Category.COLLECTIVE)}
_SYNC_IDS = frozenset(i for i, k in _SUMMARY_KIND.items() if k is Category.SYNC)
_LAUNCH_IDS = frozenset(i for i, k in _SUMMARY_KIND.items() if k is Category.LAUNCH)
# Calls whose GPU work a device-clock record times (pipeline/device_times.py): kept by a sink
# even past its budget, so that device time covers every one.
_DEVICE_WORK_IDS = ids_in(*ACTIVITY_OF)
MAX_DEVICE_CALLS = 65536  # per sink; past it, its device time is not complete (device_counted)


@dataclass
class GpuSummary:
    calls: int = 0
    launches: int = 0
    memcpy_bytes: dict = field(default_factory=dict)  # direction -> bytes
    sync_ns: int = 0
    kernels: set = field(default_factory=set)  # distinct kernel function pointers
    nccl_calls: int = 0   # NCCL collectives and send/recv
    nccl_bytes: int = 0
    # Calls that may belong here but were not attributed: each counts 1/N on each of its
    # N candidates, so the sum over spans never exceeds the ambiguous calls.
    ambiguous: float = 0.0
    # Kernels that graph launches ran (their captures' kernels x launches). A graph launch
    # counts as one in `launches`; its kernels count here, never in `launches`.
    graph_kernels: int = 0

    def add_graph(self, kernels: tuple, launches: int) -> None:
        for func, n in kernels:
            self.graph_kernels += n * launches
            self.kernels.add(func)

    def add_many(self, call: int, detail: int, count: int, nbytes: int, duration_ns: int) -> None:
        self.calls += count
        kind = _SUMMARY_KIND.get(call)  # one dict lookup: this runs for every call
        if kind is None:
            return
        if kind is Category.LAUNCH:
            self.launches += count
            self.kernels.add(detail)
        elif kind is Category.GRAPH:
            self.launches += count
        elif kind is Category.MEMCPY:
            d = MEMCPY_DIRECTIONS.get(detail, "default")
            self.memcpy_bytes[d] = self.memcpy_bytes.get(d, 0) + nbytes
        elif kind is Category.SYNC:
            self.sync_ns += duration_ns
        elif kind is Category.COLLECTIVE:
            self.nccl_calls += count
            self.nccl_bytes += nbytes


class CallSink:
    """Children of one span: the first `budget` calls one by one, the rest rolled
    up by (call, detail)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.calls: list[tuple[CudaCall, str]] = []
        self.rollups: dict[tuple[int, int], RollupAgg] = {}
        self.summary = GpuSummary()
        self.attributed: dict[str, int] = {}  # calls by attribution outcome
        self.streamed = 0  # calls that came one by one (the rest were counted in the kernel)
        self.device_calls: list[CudaCall] = []  # its launches, copies, graph launches, one by one
        self.device_counted = False  # some of those came counted (no device time can be theirs)

    def add(self, c: CudaCall, attribution: str) -> None:
        self.streamed += 1
        if c.call in _DEVICE_WORK_IDS:
            if len(self.device_calls) < MAX_DEVICE_CALLS:
                self.device_calls.append(c)
            else:
                self.device_counted = True
        detail, nbytes, duration_ns = c.amounts()
        self.summary.add_many(c.call, detail, 1, nbytes, duration_ns)
        if type(c) is GraphCall and c.kernels:
            self.summary.add_graph(c.kernels, 1)
        self.attributed[attribution] = self.attributed.get(attribution, 0) + 1
        if len(self.calls) < self.budget:
            self.calls.append((c, attribution))
            return
        agg = self.rollups.get((c.call, detail))
        if agg is None:
            agg = self.rollups[(c.call, detail)] = RollupAgg(c.call, detail)
            if type(c) is GraphCall:
                agg.kernels = c.kernels
        agg.add(c, nbytes, duration_ns)

    def add_rollup(self, agg: RollupAgg, attribution: str, given: bool = False) -> None:
        """Calls already folded together elsewhere (held while their request was not
        known): merged into this sink's rollup for (call, detail). `given`: the caller
        hands `agg` over (a settled hold's fold, made for this): kept as it is where this
        sink has none for its key, else copied."""
        self.add_rollups((agg,), attribution, given)

    def add_rollups(self, aggs, attribution: str, given: bool = False) -> None:
        """add_rollup for each of `aggs`, in one pass (a settled hold's folds: a request's
        kernels, dozens in a forward pass)."""
        summary, rollups, n = self.summary, self.rollups, 0
        for agg in aggs:
            summary.add_many(agg.call, agg.detail, agg.count, agg.bytes, agg.duration_ns)
            if agg.call in _DEVICE_WORK_IDS:
                self.device_counted = True
            if agg.kernels:
                summary.add_graph(agg.kernels, agg.count)
            n += agg.count
            mine = rollups.get((agg.call, agg.detail))
            if mine is None:
                rollups[(agg.call, agg.detail)] = agg if given else agg.copy()
                continue
            mine.first_ts = min(mine.first_ts, agg.first_ts) if mine.count else agg.first_ts
            mine.count += agg.count
            mine.bytes += agg.bytes
            mine.duration_ns += agg.duration_ns
            mine.last_ts = max(mine.last_ts, agg.last_ts)
            mine.last_end_ts = max(mine.last_end_ts, agg.last_end_ts)
        self.attributed[attribution] = self.attributed.get(attribution, 0) + n

    def add_aggregate(self, call: int, detail: int, count: int, nbytes: int, duration_ns: int,
                      ts_ns: int, attribution: str, kernels: Optional[tuple] = None) -> None:
        """Calls already counted in the kernel (the BPF rollup map), read at `ts_ns`."""
        self.add_rollup(RollupAgg(call, detail, count, nbytes, duration_ns, ts_ns, ts_ns, ts_ns, kernels),
                        attribution, True)

    @property
    def rolled_up(self) -> int:
        return sum(a.count for a in self.rollups.values())

    def kernel_funcs(self) -> set:
        """Kernel function pointers/handles named in this sink (for symbolising): those
        launched, and a graph launch's kernels, named like launches (export:
        gpu.graph.kernels). One pass over each: a request may count dozens of kernels."""
        funcs = set()
        for c, _ in self.calls:
            if c.call in _LAUNCH_IDS:
                funcs.add(c.func)
            elif type(c) is GraphCall and c.kernels:
                funcs.update(f for f, _n in c.kernels)
        for a in self.rollups.values():
            if a.call in _LAUNCH_IDS:
                funcs.add(a.detail)
            if a.kernels:
                funcs.update(f for f, _n in a.kernels)
        return funcs


def busy_end(c: CudaCall) -> int:
    """Where a call's share of a busy window ends: a synchronising call's return, else
    its entry."""
    return c.ts_ns + c.duration_ns if c.call in _SYNC_IDS else c.ts_ns


@dataclass
class BusyWindow:
    """The host-side estimate of when a request kept the GPU busy: from its first
    CUDA call to the end of its last synchronising call (or its last call's entry).
    Calls may arrive out of time order (held ones land when their request binds)."""
    device: Optional[int] = None  # current device of the thread at the first call
    start_ns: int = 0
    end_ns: int = 0
    api: str = API_CUDA  # whose device that ordinal numbers: the first call's API ("cuda", "hip")

    def add(self, c: CudaCall, device: int) -> None:
        # busy_end() and extend(), written out: this runs for every attributed call.
        end = c.ts_ns + c.duration_ns if c.call in _SYNC_IDS else c.ts_ns
        if self.device is None:
            self.device, self.start_ns, self.end_ns = device, c.ts_ns, end
            self.api = API_OF.get(c.call, API_CUDA)
        else:  # held calls may land late, out of time order
            if c.ts_ns < self.start_ns:
                self.start_ns = c.ts_ns
            if end > self.end_ns:
                self.end_ns = end

    def extend(self, device: int, start_ns: int, end_ns: int, call: int) -> None:
        """Calls of `call` counted together (a rollup), made from start_ns to end_ns."""
        if self.device is None:
            self.device, self.start_ns, self.end_ns = device, start_ns, end_ns
            self.api = API_OF.get(call, API_CUDA)
        else:
            self.start_ns = min(self.start_ns, start_ns)
            self.end_ns = max(self.end_ns, end_ns)

    @property
    def empty(self) -> bool:
        return self.device is None


# A request is itself, not its fields: compared and hashed by identity (eq=False). Lists
# of open requests are searched with `in` and remove(): the generated __eq__ built tuples of
# every field, ~1.5 µs a comparison, so each finish cost O(open requests) of those.
@dataclass(eq=False)
class Request:
    tgid: int
    tid: int            # the thread that read the request
    fd: int
    head: RequestHead
    start_ns: int       # BPF monotonic
    trace_id: int
    span_id: int
    sink: CallSink
    peer_addr: Optional[str] = None
    peer_port: Optional[int] = None
    listen_fd: int = -1
    server_port: Optional[int] = None
    tls: bool = False  # read through the SSL probes: url.scheme https
    end_ns: int = 0
    status: Optional[int] = None
    error: Optional[str] = None   # why the request did not complete normally
    # Records of its connection were lost while it was open (ring buffer full): what is
    # known of it is partial, so it has no span and no request metric; the kernel
    # summarised it (RequestSummary). Its calls still count.
    records_lost: bool = False
    lost_before: int = 0  # its process's connection records known lost when it opened (Proc.records_lost)
    lost_while_open: int = 0  # ... and learnt of while it was open: its span says so
    # It began before its process's CUDA probes were attached (Proc.probes_from_ns): its
    # calls before then were not seen, and its span says so.
    before_probes: bool = False
    parent_trace_id: Optional[int] = None
    parent_span_id: Optional[int] = None
    parent_sampled: Optional[bool] = None  # the incoming traceparent's sampled flag
    sampled: bool = True  # its trace goes out over OTLP (pipeline/sampling.py)
    busy: BusyWindow = field(default_factory=BusyWindow)
    route: Optional[str] = None          # set by enrich: http.route
    gpu_seconds: Optional[float] = None  # set by the cost stage
    cost: Optional[float] = None
    cost_source: str = HOST_WINDOW  # otel_gpu.cost.source of gpu_seconds (pipeline/cost.py)
    # Device-clock mode (pipeline/device_times.py): the device intervals of every launch, copy
    # and graph launch it made, once all came; None: not in that mode, or not all came.
    device_busy: Optional[tuple] = None
    cost_pending: bool = False  # it left before its cost was settled (a RequestCost follows)
    feature: Optional[str] = None
    resource: Any = None                 # set by enrich: the process's OTel Resource
    kernel_names: dict = field(default_factory=dict)  # set by enrich: func -> name or None
    device_identity: Any = None  # set by enrich: gpu_devices.Identity of busy.device
    context: int = 0  # the execution unit it bound to (pipeline/contexts.py); 0: none
    # Where its time went, ns by time_split.PARTS, from its serving thread (pipeline/time_split.py):
    times_start: Optional[tuple] = None  # the thread's sums at its first read
    time_split: Optional[tuple] = None   # None: not split (its answer came from another thread, or unknown)
    time_shared: bool = False  # the split is its serving thread's, which did other work meanwhile
    queued_ns: Optional[int] = None  # from its start to its first batch step, if streamed (pipeline/steps.py)
    untracked_connections: int = 0  # its process's connections the kernel could not track, at its end
    # Its response as written (pipeline/steps.py reads batch membership from it):
    headers_ts: int = 0   # when its response headers were written; 0: not yet
    chunks: int = 0       # writes that carried its response body (a streamed token each, for SSE)
    streamed: Optional[bool] = None  # its response's body length is not declared; None: head not seen alone
    # When it answered, latest last (bounded): each chunk of a streamed response; the first
    # write of any other (its head, even if its body follows in another write).
    chunk_ts: list = field(default_factory=list)

    def answered(self, ts: int) -> None:
        if len(self.chunk_ts) >= MAX_CHUNK_TIMES:
            del self.chunk_ts[:MAX_CHUNK_TIMES // 2]
        self.chunk_ts.append(ts)


@dataclass(eq=False)  # as Request
class ProcessWindow:
    """CUDA calls of one process, over one flush interval, that no single request
    owns: `ambiguous` ones (with the candidate requests as links), `shared` ones (one
    window per batch step, cut at synchronising calls, linked to the requests in flight
    in related processes) or `outside`."""
    tgid: int
    attribution: str
    start_ns: int
    end_ns: int
    sink: CallSink
    candidates: list = field(default_factory=list)  # (trace_id, span_id) of candidate requests
    # The same, to look up: a busy process's window links thousands of requests in one flush.
    candidate_ids: set = field(default_factory=set, repr=False)
    device: Optional[int] = None         # current device of the thread of its first call
    untracked_connections: int = 0       # most connections of the process left untracked meanwhile
    resource: Any = None                 # set by enrich
    kernel_names: dict = field(default_factory=dict)  # set by enrich
    # Set by the cost stage: its GPU time no request's window covers, and for an
    # ambiguous or shared window that time split among the candidates ((trace_id, span_id) -> s).
    gpu_seconds: Optional[float] = None
    cost: Optional[float] = None
    cost_source: str = HOST_WINDOW  # as Request's
    device_busy: Optional[tuple] = None  # as Request's (pipeline/device_times.py)
    split: dict = field(default_factory=dict)
    split_features: dict = field(default_factory=dict)
    # A shared window (one batch step) until its members are known (pipeline/steps.py):
    linked: dict = field(default_factory=dict)      # (trace_id, span_id) -> candidate Request
    link_rules: dict = field(default_factory=dict)  # (trace_id, span_id) -> rules.BATCH_MEMBER or OVERLAP
    links_sampled: bool = False  # a request it links to was sampled: its trace goes out too
