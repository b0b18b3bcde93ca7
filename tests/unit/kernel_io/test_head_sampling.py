"""kernel_io/program.py sample_heads: a kernel whose verifier refuses the head programs
(bpf/head_sampling.c) leaves sampling to the collector, said once and counted, and the
kernel is never told to draw (head_settings stays off), so nothing waits on a scan."""
import logging
import sys
import types

from otel_gpu.kernel_io.program import BpfProgram
from otel_gpu.ratelimit import Stats


class RefusingBpf:
    """The two tables and load_func of a bcc BPF object, whose loads the kernel refuses."""

    def __init__(self) -> None:
        self.written: list = []

    def __getitem__(self, name):
        if name == "head_settings":
            raise AssertionError("head_settings written although the programs did not load")
        return self

    def __setitem__(self, key, value) -> None:
        self.written.append(key)

    def load_func(self, name, kind):
        raise Exception(f"Failed to load BPF program {name!r}: Argument list too long")


def test_refused_head_programs_leave_sampling_to_the_collector(caplog, monkeypatch):
    monkeypatch.setitem(sys.modules, "bcc", types.SimpleNamespace(BPF=types.SimpleNamespace(TRACEPOINT=5)))
    program = object.__new__(BpfProgram)  # no kernel: only what sample_heads touches
    program.bpf, program.stats = RefusingBpf(), Stats()
    with caplog.at_level(logging.WARNING):
        program.sample_heads(123, parents=False)
    assert program.stats.snapshot().get("head_sampling_unavailable") == 1
    assert "decided by the collector alone" in caplog.text and program.bpf.written == []
    program.sample_heads(None, parents=False)  # a sampler the kernel has nothing to decide for
    assert program.stats.snapshot().get("head_sampling_unavailable") == 1
