"""The collector's scan traces a process it finds before attaching its CUDA probes (so
its HTTP is seen at once), and says from when its calls are seen: the ProcessSeen of a
process whose CUDA probes attached only in that scan carries the time, so a request it
began earlier is marked (tests/unit/pipeline/test_stitcher.py). Discovery and the BPF
program are fakes (the order with real probes: tests/bpf/test_first_requests.py)."""
import time

from otel_gpu.collector import Collector
from otel_gpu.config import Config
from otel_gpu.cuda_calls import PYTHON, RUNTIME, TLS
from otel_gpu.probes.discovery import ProbeTarget, ScanResult
from otel_gpu.records import ProcessSeen
from tests.unit.test_collector_groups import FakeDiscovery, FakeProgram

CUDART = ProbeTarget(RUNTIME, "/x/libcudart.so.12", (1, 2))
SSL = ProbeTarget(TLS, "/x/libssl.so.3", (1, 4))
PY = ProbeTarget(PYTHON, "/x/python3", (1, 3))
NEW, OLD, PLAIN = 200, 100, 300


class AttachingProgram(FakeProgram):
    """Probes attach once per (file, pid); the order of traces and attaches is kept."""

    def __init__(self):
        super().__init__()
        self.probed = set()

    def attach(self, target, pid=None):
        self.calls.append(("attach", target.kind, pid))
        if (target.key, pid) in self.probed:
            return 0
        self.probed.add((target.key, pid))
        return 3

    def list_python_threads(self, pid, threads):
        pass


def scan(exes=(), **found):
    c = Collector(Config(proc_root="/nonexistent", exes=exes, python_context=False))
    c.program, c.discovery = AttachingProgram(), FakeDiscovery()
    pushed = []
    c._push = pushed.extend
    c.discovery.result = ScanResult(**found)
    before = time.monotonic_ns()
    c._scan()
    seen = {r.tgid: r.probes_from_ns for r in pushed if isinstance(r, ProcessSeen)}
    return c, seen, before


def test_with_exe_a_new_process_is_traced_first_and_its_calls_seen_from_its_attach():
    c, seen, before = scan(exes=("server",), cuda_pids={NEW}, targets=[CUDART, PY],
                           by_pid={NEW: [CUDART, PY]})
    calls = c.program.calls
    assert calls.index(("trace", NEW)) < calls.index(("attach", RUNTIME, NEW))
    assert before < seen[NEW] <= time.monotonic_ns()


def test_default_mode_marks_the_processes_mapping_a_file_probed_only_now():
    """The file-wide probe on a new file: the processes mapping it are marked; a
    process whose files were probed before, or that maps only libssl, is not."""
    c, seen, _ = scan(cuda_pids={NEW, PLAIN}, targets=[CUDART, SSL],
                      by_pid={NEW: [CUDART], PLAIN: [SSL]})
    assert seen[NEW] > 0 and seen[PLAIN] == 0
    c.discovery.result = ScanResult({NEW, OLD}, [CUDART], by_pid={NEW: [CUDART], OLD: [CUDART]})
    pushed = []
    c._push = pushed.extend
    c._scan()  # the file is probed already: the new process's calls are all seen
    assert [(r.tgid, r.probes_from_ns) for r in pushed if isinstance(r, ProcessSeen)] == [(OLD, 0)]
