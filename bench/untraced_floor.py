"""The floor under item 7: what the kernel alone charges a syscall for having a BPF
program on its tracepoints. Programs that return at once are attached (bcc, in this
process) where the collector's host-wide syscall probes are: every syscall's exit (raw),
the open syscalls' entries (library discovery) and process exit; whatever the collector
adds beyond them is our programs' bodies. `entries`: every syscall's entry (raw) as well,
where the HTTP probes were attached until 2026-12-05 (for the side-by-side figure)."""
from __future__ import annotations

import contextlib

from otel_gpu.probes.rows import HTTP_RAW_TRACEPOINTS, HTTP_TRACEPOINTS, LIBRARY_TRACEPOINTS
from otel_gpu.probes.source import kernel_headers_hint

ENTRY = "raw_syscalls:sys_enter"


def noop_text(entries: bool = False) -> str:
    raw = list(HTTP_RAW_TRACEPOINTS) + ([ENTRY] if entries else [])
    return "\n".join([f"RAW_TRACEPOINT_PROBE({tp.split(':')[1]}) {{ return 0; }}" for tp in raw]
                     + [f"TRACEPOINT_PROBE({tp.split(':')[0]}, {tp.split(':')[1]}) {{ return 0; }}"
                        for tp in HTTP_TRACEPOINTS + LIBRARY_TRACEPOINTS])


@contextlib.contextmanager
def noop_programs(entries: bool = False):
    """The no-op programs attached while the block runs."""
    kernel_headers_hint()
    from bcc import BPF
    bpf = BPF(text=noop_text(entries).encode())
    try:
        yield bpf
    finally:
        bpf.cleanup()
