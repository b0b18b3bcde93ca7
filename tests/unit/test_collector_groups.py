"""The collector's scan with related processes: HTTP servers related to a CUDA process
are traced (once), the CUDA process follows the one server (or all of several), and
everything is forgotten when the processes go. Discovery and the BPF program are fakes."""
from otel_gpu.probes.launch_routes import LaunchRoutes
from otel_gpu.collector import Collector
from otel_gpu.config import Config
from otel_gpu.records import ProcExit
from otel_gpu.probes.discovery import ScanResult
from otel_gpu.kernel_io.program import FOLLOW_ALL

FRONT, WORKER, OTHER = 100, 200, 300


class FakeConnections:
    """kernel_io/connection_table.ConnectionTable, recording into its program's lists."""

    def __init__(self, program):
        self.program = program
        self.short = None  # why seed stops short, if it does

    def seed(self, pid, fds):
        self.program.seeded.append(pid)
        return fds, self.short

    def set_shares(self, limits):
        self.program.calls.append(("shares", dict(limits)))


class FakeProgram:
    def __init__(self):
        self.calls, self.seeded = [], []
        self.connections = FakeConnections(self)
        self.launch_routes = LaunchRoutes(self, {})  # attaches through attach() below

    def attach(self, target, pid=None):
        return 0

    def attach_load_probe(self, target):
        self.calls.append(("load probe", target.path))
        return True

    def probed_pids(self):
        return set()

    def set_runtime_text(self, by_pid):
        self.runtime_text = by_pid

    def trace(self, pid):
        self.calls.append(("trace", pid))

    def follow(self, pid, server):
        self.calls.append(("follow", pid, server))

    def trace_python(self, pid, offset):
        self.calls.append(("python", pid))

    def forget(self, pids):
        self.calls.append(("forget", sorted(pids)))


class FakeDiscovery:
    def __init__(self):
        self.result = ScanResult(set(), [])

    def scan(self, only=None):
        self.only = only
        return self.result


def collector(tmp_path):
    c = Collector(Config(proc_root=str(tmp_path)))
    c.program, c.discovery = FakeProgram(), FakeDiscovery()
    keys = {FRONT: "cgroup:/a", WORKER: "cgroup:/a", OTHER: "cgroup:/a"}
    c.groups.key = keys.get  # the grouping rule itself is tests/unit/pipeline/test_groups.py's
    return c


def test_related_servers_are_traced_and_the_worker_follows_them(tmp_path):
    c = collector(tmp_path)
    c.discovery.result = ScanResult({WORKER}, [], servers={FRONT})
    c._scan()
    # The related server's share of the connection table: half of it (65,536), the worker none.
    assert c.program.calls == [("trace", WORKER), ("trace", FRONT), ("shares", {FRONT: 32768}),
                               ("follow", WORKER, FRONT)]
    assert c.groups.traced == {WORKER, FRONT}
    c.program.calls.clear()
    c._scan()  # nothing new
    assert c.program.calls == []

    c.discovery.result = ScanResult({WORKER}, [], servers={FRONT, OTHER})
    c._scan()  # a second related server: the worker streams always
    assert c.program.calls == [("trace", OTHER), ("shares", {FRONT: 16384, OTHER: 16384}),
                               ("follow", WORKER, FOLLOW_ALL)]

    c.program.calls.clear()
    c.discovery.result = ScanResult({WORKER}, [], servers={FRONT})
    c._push([ProcExit(OTHER, 1)])
    assert c.program.calls == [("forget", [OTHER]), ("shares", {FRONT: 32768})] and OTHER not in c._servers
    c._scan()
    assert c.program.calls[2:] == [("follow", WORKER, FRONT)]

    c.program.calls.clear()
    c.discovery.result = ScanResult({WORKER}, [])
    c._push([ProcExit(FRONT, 2)])
    c._scan()  # no related server left: its own HTTP activity only
    assert c.program.calls == [("forget", [FRONT]), ("shares", {}), ("follow", WORKER, None)]


def test_a_cuda_process_that_listens_is_followed_too(tmp_path):
    c = collector(tmp_path)
    c.discovery.result = ScanResult({WORKER, FRONT}, [], listening={FRONT})
    c._scan()
    assert ("follow", WORKER, FRONT) in c.program.calls
    assert not [call for call in c.program.calls if call[:2] == ("follow", FRONT)]  # follows no one but itself


def test_a_process_seen_loading_cuda_is_scanned_alone_and_added(tmp_path):
    """The load probe's prompt scan (collector._scan(only)) traces the new process and
    keeps the ones traced before, which it did not look at."""
    c = collector(tmp_path)
    c.discovery.result = ScanResult({WORKER}, [])
    c._scan()
    c.discovery.result = ScanResult({OTHER}, [])
    c._scan({OTHER})
    assert c.discovery.only == {OTHER}
    assert c._traced_pids == {WORKER, OTHER}
    assert ("trace", OTHER) in c.program.calls


def test_load_probes_on_discovered_files_in_the_default_mode_only(tmp_path):
    """With --pid/--exe a file-wide load probe would outlive the selected processes
    (their probes must all go when they exit): only the default mode adds them at scans."""
    from otel_gpu.probes.discovery import ProbeTarget
    from otel_gpu.cuda_calls import PYTHON, RUNTIME
    files = [ProbeTarget(RUNTIME, "/x/libcudart.so.12", (1, 2)), ProbeTarget(PYTHON, "/x/python3", (1, 3))]
    for exes, expected in (((), [("load probe", "/x/libcudart.so.12")]), (("server",), [])):
        c = collector(tmp_path)
        c.config = Config(proc_root=str(tmp_path), exes=exes)
        c.discovery.result = ScanResult({WORKER}, files, by_pid={WORKER: files})
        c._scan()
        assert [x for x in c.program.calls if x[0] == "load probe"] == expected


def test_seeding_cut_short_goes_on_at_the_next_flush_for_that_process_only(tmp_path):
    """A process with more connections than one scan seeds (SEED_PER_SCAN) or a full
    table takes is seeded again at the next flush; one past its share is not."""
    c = collector(tmp_path)
    c.discovery.result = ScanResult({WORKER}, [], servers={FRONT})
    c.program.connections.short = "per scan"
    c._scan()
    assert c.seeding.pending == {WORKER, FRONT}
    c.program.seeded.clear()
    c.program.connections.short = "share"
    c.seeding.at_flush(c._traced_pids | c._servers)
    assert c.program.seeded == [FRONT, WORKER] and c.seeding.pending == set()
    c.program.seeded.clear()
    c.seeding.at_flush(c._traced_pids | c._servers)
    assert c.program.seeded == []
