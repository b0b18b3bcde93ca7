"""Draws spans as trees: the console exporter and `otel-gpu traces` share it. Text is
sanitised again as it is drawn (a store may come from a version that did not at entry)."""
from __future__ import annotations

from typing import Sequence

from opentelemetry.sdk.trace import ReadableSpan

from . import sanitize
from . import semconv as sc

_SHOWN = (sc.HTTP_RESPONSE_STATUS_CODE, sc.GPU_ATTRIBUTION, sc.GPU_KERNEL_NAME, sc.GPU_GRID,
          sc.GPU_BLOCK, sc.GPU_MEMCPY_BYTES, sc.GPU_MEMCPY_DIRECTION, sc.GPU_ALLOC_BYTES,
          sc.GPU_ROLLUP_COUNT, sc.GPU_LAUNCHES, sc.GPU_MEMCPY_H2D_BYTES, sc.GPU_MEMCPY_D2H_BYTES,
          sc.GPU_SYNC_DURATION_NS, sc.GPU_DISTINCT_KERNELS, sc.GPU_CALLS_AMBIGUOUS,
          *sc.TIME_ATTRIBUTES, sc.GPU_TIME_SHARED,
          sc.GPU_CUDA_RETURN_CODE, sc.GPU_HIP_RETURN_CODE, sc.GPU_NCCL_OP, sc.GPU_NCCL_BYTES, sc.GPU_NCCL_DATATYPE,
          sc.GPU_NCCL_REDUCTION,
          sc.GPU_NCCL_ROOT, sc.GPU_NCCL_PEER, sc.GPU_NCCL_COMM_NRANKS, sc.GPU_NCCL_COMM_RANK, sc.GPU_NCCL_CALLS,
          sc.GPU_NCCL_TOTAL_BYTES, sc.GPU_GRAPH_KERNEL_NODES, sc.GPU_GRAPH_KERNEL_LAUNCHES)


def graph_kernels_text(attrs) -> str:
    """A graph launch's kernels with their counts ("gemm x3, relu x1"), "" when unknown."""
    kernels, counts = attrs.get(sc.GPU_GRAPH_KERNELS) or (), attrs.get(sc.GPU_GRAPH_KERNEL_COUNTS) or ()
    return ", ".join(f"{sanitize.text(str(k)).split('(', 1)[0]} x{n}" for k, n in zip(kernels, counts))


def _fmt_attr(v) -> str:
    if isinstance(v, (list, tuple)):
        return sanitize.text("x".join(str(x) for x in v))
    return sanitize.text(str(v))


def render_tree(spans: Sequence[ReadableSpan]) -> str:
    """One block per trace: root first, children by start time, durations in ms.
    CUDA durations are host-side call times (enqueue), not GPU execution."""
    by_parent: dict = {}
    ids = {s.context.span_id for s in spans}
    roots = []
    for s in spans:
        parent = s.parent.span_id if s.parent is not None else None
        if parent in ids:
            by_parent.setdefault(parent, []).append(s)
        else:
            roots.append(s)
    lines: list[str] = []

    def walk(span: ReadableSpan, prefix: str, last: bool, depth: int) -> None:
        dur_ms = (span.end_time - span.start_time) / 1e6
        attrs = span.attributes or {}
        graph = graph_kernels_text(attrs)
        shown = " ".join([f"{k.split('.', 1)[-1]}={_fmt_attr(attrs[k])}" for k in _SHOWN if k in attrs]
                         + ([f"graph.kernels=[{graph}]"] if graph else []))
        branch = "" if depth == 0 else ("└─ " if last else "├─ ")
        head = f"{sanitize.text(span.name)}  {dur_ms:.3f} ms"
        if depth == 0:
            svc = span.resource.attributes.get(sc.SERVICE_NAME, "?") if span.resource else "?"
            head = f"[{_fmt_attr(svc)}] trace {span.context.trace_id:032x}\n{head}"
        lines.append(f"{prefix}{branch}{head}  {shown}".rstrip())
        kids = sorted(by_parent.get(span.context.span_id, []), key=lambda k: k.start_time)
        child_prefix = prefix + ("" if depth == 0 else ("   " if last else "│  "))
        for i, k in enumerate(kids):
            walk(k, child_prefix, i == len(kids) - 1, depth + 1)

    for r in sorted(roots, key=lambda s: s.start_time):
        walk(r, "", True, 0)
    return "\n".join(lines)
