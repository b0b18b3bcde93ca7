"""The floor under item 7: what the kernel alone charges a syscall for having a BPF
program on its tracepoint. A program that returns at once is attached (bcc, in this
process) to the same tracepoints as the collector's HTTP probes; whatever the
collector adds beyond it is our programs' bodies."""
from __future__ import annotations

import contextlib

from otel_gpu.probes.source import kernel_headers_hint
from otel_gpu.cuda_calls import HTTP_TRACEPOINTS


def noop_text() -> str:
    return "\n".join(f"TRACEPOINT_PROBE({tp.split(':')[0]}, {tp.split(':')[1]}) {{ return 0; }}"
                     for tp in HTTP_TRACEPOINTS)


@contextlib.contextmanager
def noop_programs():
    """The no-op programs attached while the block runs."""
    kernel_headers_hint()
    from bcc import BPF
    bpf = BPF(text=noop_text().encode())
    try:
        yield bpf
    finally:
        bpf.cleanup()
