"""bpf/sched_probes.c and bpf/thread_times.c when the kernel does not run the sched_switch
program for a switch (on this 6.18 kernel, about 4 in 70,000 switches of a thread woken
beside busy processes: docs/spans-and-metrics.md). A thread seen switching away while its
entry says it is off the CPU had its switch in unseen: it is taken as switched in then,
and counted (`switch_unseen`, the status's sched_switches_unseen).

The switch program runs here through BPF_PROG_TEST_RUN, in this thread, on the collector's
loaded program: `prev` is this thread (the running task), `preempt` is set (its state is not
read), and `next` a pointer the program cannot read (no thread). Each run is a switch away
the kernel never made; two in a row are a switch in unseen between them. The kernel also
runs the program for this thread's real switches, which end the streak (a real switch in
makes the thread running again): a run counts only when no real switch of this thread came
since the run before it (its /proc counts of switches did not move)."""
from __future__ import annotations

import os

import pytest

from otel_gpu.kernel_io.program import BpfProgram
from otel_gpu.kernel_io.run_program import run_raw_tracepoint
from otel_gpu.probes import kernel_btf

RUNS = 200


@pytest.fixture(scope="module")
def program():
    from otel_gpu.config import Config
    from otel_gpu.probes.source import ProgramOptions
    from otel_gpu.ratelimit import Stats
    if kernel_btf.task_time_offsets() is None:
        pytest.skip("no kernel BTF: the time split is off (bpf/thread_times.c)")
    p = BpfProgram(ProgramOptions.from_config(Config()), Stats())  # the split on, as by default
    p.trace(os.getpid())
    yield p
    p.close()


def switches() -> int:
    """This thread's context switches so far, as the kernel counts them."""
    with open("/proc/thread-self/status") as f:  # voluntary_ctxt_switches, nonvoluntary_ctxt_switches
        return sum(int(line.split()[1]) for line in f if "ctxt_switches:" in line)


def test_a_switch_away_with_its_switch_in_unseen_is_counted_once(program):
    from bcc import BPF
    fd = program.bpf.load_func(b"raw_tracepoint__sched_switch", BPF.RAW_TRACEPOINT).fd
    unseen = lambda: program.kernel_counters.total("switch_unseen")  # noqa: E731
    before = switches()
    run_raw_tracepoint(fd, 1, 0, 0, 0)  # the thread's entry made, and switched away
    checked = 0
    for _ in range(RUNS):
        start, counted = switches(), unseen()
        run_raw_tracepoint(fd, 1, 0, 0, 0)
        counted, end = unseen() - counted, switches()
        if end == before:  # no real switch since the run before this one: its switch in went unseen
            assert counted == 1
            checked += 1
        before = start  # else a real switch in made it running again (and a real switch away
        #                 right after a run of ours is one more unseen switch in): not checked
    assert checked >= RUNS // 2, checked  # most runs are back to back with no real switch
