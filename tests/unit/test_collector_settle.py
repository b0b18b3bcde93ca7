"""The collector's answer to a process that loaded or opened a CUDA library
(bpf/library_probes.c's `loaded`, with the kinds it opened): scanned at once, scanned
again while it does not map a file of each kind (an open comes before the loader maps the
file), never past SETTLE_S, and not again once it maps them. Discovery and the BPF program
are fakes."""
from otel_gpu import collector as collector_module
from otel_gpu.cuda_calls import DEVICE_CLOCK, RUNTIME
from otel_gpu.probes.discovery import ProbeTarget, ScanResult
from tests.unit.test_collector_groups import FakeDiscovery, FakeProgram, collector

OPENER, COPIER = 400, 500
CUDART = ProbeTarget(RUNTIME, "/usr/lib/libcudart.so.12", (1, 10))
CUPTI = ProbeTarget(DEVICE_CLOCK, "/opt/otel-gpu/libotel_gpu_cupti.so", (1, 11))


def _maps(pid, *targets):
    return ScanResult({pid}, list(targets), by_pid={pid: list(targets)})


class LoadingProgram(FakeProgram):
    def __init__(self):
        super().__init__()
        self.loaded = {}

    def loaded_pids(self):
        out, self.loaded = self.loaded, {}
        return out


class CountingDiscovery(FakeDiscovery):
    def __init__(self):
        super().__init__()
        self.scans = []

    def scan(self, only=None):
        self.scans.append(set(only or ()))
        return self.result


def _setup(tmp_path, monkeypatch):
    now = [1000.0]
    monkeypatch.setattr(collector_module.time, "monotonic", lambda: now[0])
    c = collector(tmp_path)
    c.program, c.discovery = LoadingProgram(), CountingDiscovery()
    return c, now


def test_an_opening_process_is_scanned_until_it_maps_the_library(tmp_path, monkeypatch):
    c, now = _setup(tmp_path, monkeypatch)
    c.program.loaded = {OPENER: frozenset({RUNTIME})}
    c._settle()
    assert c.discovery.scans == [{OPENER}] and OPENER in c._settling  # opened, not mapped yet
    c._settle()
    assert len(c.discovery.scans) == 1  # not again before SETTLE_EVERY_S
    now[0] += collector_module.SETTLE_EVERY_S
    c.discovery.result = _maps(OPENER, CUDART)  # the loader has mapped it
    c._settle()
    assert c.discovery.scans[-1] == {OPENER} and ("trace", OPENER) in c.program.calls
    assert c._settling == {}
    now[0] += collector_module.SETTLE_EVERY_S
    c._settle()
    assert len(c.discovery.scans) == 2  # a CUDA process now: the periodic scans have it


def test_a_process_that_only_reads_the_file_is_dropped_after_settle_s(tmp_path, monkeypatch):
    c, now = _setup(tmp_path, monkeypatch)
    c.program.loaded = {COPIER: frozenset({RUNTIME})}
    scans = 0
    end = now[0] + collector_module.SETTLE_S + 1
    while now[0] < end:
        c._settle()
        now[0] += collector_module.SETTLE_EVERY_S
        scans = len(c.discovery.scans)
    assert c._settling == {}
    assert scans <= collector_module.SETTLE_S / collector_module.SETTLE_EVERY_S + 2
    assert ("trace", COPIER) not in c.program.calls


def test_a_cuda_process_opening_the_device_clock_library_is_scanned_until_it_maps_it(tmp_path, monkeypatch):
    """libcudart's open and the device-clock library's come moments apart (the driver loads
    the library at cuInit): a scan between finds libcudart alone. Settled by that, the
    device-clock probe would wait for the next full scan, and the records the library hands
    over before it would be lost."""
    c, now = _setup(tmp_path, monkeypatch)
    c.program.loaded = {OPENER: frozenset({RUNTIME})}
    c._settle()
    now[0] += collector_module.SETTLE_EVERY_S
    c.program.loaded = {OPENER: frozenset({DEVICE_CLOCK})}  # it opens libotel_gpu_cupti.so
    c.discovery.result = _maps(OPENER, CUDART)
    c._settle()
    assert c.discovery.scans[-1] == {OPENER} and OPENER in c._settling  # opened, not mapped yet
    now[0] += collector_module.SETTLE_EVERY_S
    c.discovery.result = _maps(OPENER, CUDART, CUPTI)  # the loader has mapped it
    c._settle()
    assert c.discovery.scans[-1] == {OPENER} and c._settling == {}
    scans = len(c.discovery.scans)
    now[0] += collector_module.SETTLE_EVERY_S
    c._settle()
    assert len(c.discovery.scans) == scans
    now[0] += collector_module.SETTLE_EVERY_S
    c.program.loaded = {OPENER: frozenset({DEVICE_CLOCK})}  # opened again (a dlopen by path): mapped already
    c._settle()
    assert c._settling == {} and len(c.discovery.scans) == scans + 1
