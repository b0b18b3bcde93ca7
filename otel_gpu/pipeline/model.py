"""What the stitcher hands on: finished requests and per-process windows of CUDA
calls that belong to no single request. Plain data; export builds spans from it."""
from __future__ import annotations

from dataclasses import dataclass, field
from typing import Optional

from .events import (CudaCall, KERNEL_LAUNCH_CALLS, LAUNCH_CALLS, MEMCPY_CALLS,
                     MEMCPY_DIRECTIONS, SYNC_CALLS)
from .http_parser import RequestHead

# How a CUDA call was tied to a request.
THREAD = "thread"        # made on the thread that read the request, while it was open
PROCESS = "process"      # another thread, while the process had exactly one open request
AMBIGUOUS = "ambiguous"  # several requests open and the thread does not decide: not guessed
OUTSIDE = "outside"      # no request open in the process
ATTRIBUTIONS = (THREAD, PROCESS, AMBIGUOUS, OUTSIDE)


@dataclass
class RollupAgg:
    """Calls folded together, by (call, function): counts always add up."""
    call: int
    func: int
    count: int = 0
    bytes: int = 0
    duration_ns: int = 0
    first_ts: int = 0
    last_ts: int = 0
    last_end_ts: int = 0

    def add(self, c: CudaCall) -> None:
        if not self.count:
            self.first_ts = c.ts_ns
        self.count += 1
        self.bytes += c.bytes
        self.duration_ns += c.duration_ns
        self.last_ts = c.ts_ns
        self.last_end_ts = max(self.last_end_ts, c.ts_ns + c.duration_ns)


@dataclass
class GpuSummary:
    calls: int = 0
    launches: int = 0
    memcpy_bytes: dict = field(default_factory=dict)  # direction -> bytes
    sync_ns: int = 0
    kernels: set = field(default_factory=set)  # distinct kernel function pointers
    ambiguous: int = 0  # calls that may belong here but were not attributed

    def add(self, c: CudaCall) -> None:
        self.add_many(c.call, c.func, c.kind, 1, c.bytes, c.duration_ns)

    def add_many(self, call: int, func: int, kind: int, count: int, nbytes: int, duration_ns: int) -> None:
        self.calls += count
        if call in LAUNCH_CALLS:
            self.launches += count
            if call in KERNEL_LAUNCH_CALLS:
                self.kernels.add(func)
        elif call in MEMCPY_CALLS:
            d = MEMCPY_DIRECTIONS.get(kind, "default")
            self.memcpy_bytes[d] = self.memcpy_bytes.get(d, 0) + nbytes
        elif call in SYNC_CALLS:
            self.sync_ns += duration_ns


class CallSink:
    """Children of one span: the first `budget` calls one by one, the rest rolled
    up by (call, function)."""

    def __init__(self, budget: int) -> None:
        self.budget = budget
        self.calls: list[tuple[CudaCall, str]] = []
        self.rollups: dict[tuple[int, int], RollupAgg] = {}
        self.summary = GpuSummary()

    def add(self, c: CudaCall, attribution: str) -> None:
        self.summary.add(c)
        if len(self.calls) < self.budget:
            self.calls.append((c, attribution))
            return
        # As in the BPF rollup map: a memcpy's direction takes the function's slot.
        func = c.kind if c.call in MEMCPY_CALLS else c.func
        agg = self.rollups.get((c.call, func))
        if agg is None:
            agg = self.rollups[(c.call, func)] = RollupAgg(c.call, func)
        agg.add(c)

    def add_aggregate(self, call: int, func: int, count: int, nbytes: int, duration_ns: int,
                      ts_ns: int) -> None:
        """Calls already counted in the kernel (the BPF rollup map). For memcpy, `func`
        carries the direction, as in the map's key."""
        kind = func if call in MEMCPY_CALLS else 0
        self.summary.add_many(call, func, kind, count, nbytes, duration_ns)
        agg = self.rollups.get((call, func))
        if agg is None:
            agg = self.rollups[(call, func)] = RollupAgg(call, func, first_ts=ts_ns)
        agg.count += count
        agg.bytes += nbytes
        agg.duration_ns += duration_ns
        agg.last_ts = agg.last_end_ts = max(agg.last_ts, ts_ns)

    @property
    def rolled_up(self) -> int:
        return sum(a.count for a in self.rollups.values())


@dataclass
class BusyWindow:
    """The host-side estimate of when a request kept the GPU busy: from its first
    CUDA call to the end of its last synchronising call (or its last call's entry)."""
    device: Optional[int] = None  # current device of the thread at the first call
    start_ns: int = 0
    end_ns: int = 0

    def add(self, c: CudaCall, device: int) -> None:
        end = c.ts_ns + (c.duration_ns if c.call in SYNC_CALLS else 0)
        if self.device is None:
            self.device, self.start_ns, self.end_ns = device, c.ts_ns, end
        else:
            self.end_ns = max(self.end_ns, end)

    @property
    def empty(self) -> bool:
        return self.device is None


@dataclass
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
    end_ns: int = 0
    status: Optional[int] = None
    error: Optional[str] = None   # why the request did not complete normally
    parent_trace_id: Optional[int] = None
    parent_span_id: Optional[int] = None
    busy: BusyWindow = field(default_factory=BusyWindow)
    gpu_seconds: Optional[float] = None  # set by the cost stage
    cost: Optional[float] = None
    feature: Optional[str] = None


@dataclass
class ProcessWindow:
    """CUDA calls of one process, over one flush interval, that no single request
    owns: `ambiguous` ones (with the candidate requests as links) or `outside`."""
    tgid: int
    attribution: str
    start_ns: int
    end_ns: int
    sink: CallSink
    candidates: list = field(default_factory=list)  # (trace_id, span_id) of candidate requests


@dataclass
class ProcessSeen:
    """First event of a process: enrichment reads /proc while it still exists."""
    tgid: int


@dataclass
class ProcessGone:
    tgid: int
    comm: str = ""  # from the exit event: names a process /proc was never read for
