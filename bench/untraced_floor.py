"""The floor under item 7: what the kernel alone charges a syscall for having a BPF
program on its tracepoint. Programs that return at once are attached (bcc, in this
process) where the collector's HTTP probes are: every syscall's entry and exit (raw)
and process exit; whatever the collector adds beyond them is our programs' bodies.
`per_syscall`: instead, the per-syscall tracepoints the probes used before (perf
events, for the side-by-side figure)."""
from __future__ import annotations

import contextlib

from otel_gpu.probes.rows import HTTP_RAW_TRACEPOINTS, HTTP_TRACEPOINTS
from otel_gpu.probes.source import kernel_headers_hint
from otel_gpu.probes.syscalls import followed


def noop_text(per_syscall: bool = False) -> str:
    if per_syscall:
        points = [f"syscalls:sys_{phase}_{name}" for name, phase in followed()]
        return "\n".join(f"TRACEPOINT_PROBE({tp.split(':')[0]}, {tp.split(':')[1]}) {{ return 0; }}"
                         for tp in points + list(HTTP_TRACEPOINTS))
    return "\n".join([f"RAW_TRACEPOINT_PROBE({tp.split(':')[1]}) {{ return 0; }}" for tp in HTTP_RAW_TRACEPOINTS]
                     + [f"TRACEPOINT_PROBE({tp.split(':')[0]}, {tp.split(':')[1]}) {{ return 0; }}"
                        for tp in HTTP_TRACEPOINTS])


@contextlib.contextmanager
def noop_programs(per_syscall: bool = False):
    """The no-op programs attached while the block runs."""
    kernel_headers_hint()
    from bcc import BPF
    bpf = BPF(text=noop_text(per_syscall).encode())
    try:
        yield bpf
    finally:
        bpf.cleanup()
