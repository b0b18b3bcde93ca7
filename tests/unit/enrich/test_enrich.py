"""The enrich stage: what it writes onto requests and windows, and when it forgets."""
from otel_gpu import semconv as sc
from otel_gpu.enrich.stage import Enrich
from otel_gpu.enrich.symbols import KernelNames
from otel_gpu.pipeline.protocols.base import RequestHead
from otel_gpu.pipeline.model import OUTSIDE, THREAD, CallSink, ProcessWindow, Request
from otel_gpu.records import ProcessGone, ProcessSeen
from otel_gpu.enrich.resources import ProcessResources
from otel_gpu.enrich.routes import RouteTemplater
from tests.unit.pipeline.calls import cuda
from tests.unit.enrich.test_resources import fake_proc


class Names:
    """A kernel namer that records what it was asked and forgotten."""

    def __init__(self):
        self.asked, self.forgotten = [], []

    def __call__(self, pid, func):
        self.asked.append((pid, func))
        return f"kernel_{func:x}" if func != 0xBAD else None

    def forget(self, pid):
        self.forgotten.append(pid)


def stage(tmp_path, names=None):
    return Enrich(ProcessResources(str(tmp_path)), RouteTemplater(["/v1/models/{model}/infer"]),
                  names or Names())


def request(pid, path, calls=()):
    r = Request(pid, pid, 3, RequestHead("GET", path, "1.1", {}), 0, 1, 2, CallSink(2))
    for c in calls:
        r.sink.add(c, THREAD)
    return r


def test_requests_get_resource_route_and_kernel_names(tmp_path):
    fake_proc(tmp_path, 7, env={"OTEL_SERVICE_NAME": "infer"})
    # Budget 2: the third launch is rolled up, and still named.
    r = request(7, "/v1/models/bert/infer", [cuda(func=0x10, pid=7), cuda(func=0xBAD, pid=7),
                                              cuda("cudaMemcpy", nbytes=4, kind=1, pid=7), cuda(func=0x20, pid=7)])
    out = stage(tmp_path).process([ProcessSeen(7), r])
    assert out[1] is r
    assert r.resource.attributes[sc.SERVICE_NAME] == "infer"
    assert r.route == "/v1/models/{model}/infer"
    assert r.kernel_names == {0x10: "kernel_10", 0xBAD: None, 0x20: "kernel_20"}


def test_windows_get_resource_and_names(tmp_path):
    fake_proc(tmp_path, 8)
    w = ProcessWindow(8, OUTSIDE, 0, 1, CallSink(8))
    w.sink.add_aggregate(cuda().call, 0x30, 5, 0, 0, 1, OUTSIDE)
    stage(tmp_path).process([w])
    assert w.resource.attributes[sc.SERVICE_NAME] == "app" and w.kernel_names == {0x30: "kernel_30"}


def test_a_process_exiting_in_the_batch_is_named_from_its_comm_then_forgotten(tmp_path):
    names = Names()
    s = stage(tmp_path, names)
    w = ProcessWindow(9, OUTSIDE, 0, 1, CallSink(8))  # /proc/9 was never read: gone already
    s.process([ProcessSeen(9), w, ProcessGone(9, "burst")])
    assert w.resource.attributes[sc.SERVICE_NAME] == "burst"
    assert names.forgotten == [9] and len(s.resources) == 0
    assert "proc_unreadable" not in s.resources.stats.snapshot()


def test_every_record_passes_in_order(tmp_path):
    fake_proc(tmp_path, 7)
    batch = [ProcessSeen(7), object(), request(7, "/a"), ProcessGone(7)]
    assert stage(tmp_path).process(batch) == batch


def test_kernel_names_from_the_process_files_are_sanitised(tmp_path):
    """A symbol name is the traced process's own bytes: escape sequences, C1 controls and
    surrogate-escaped bytes never reach the spans or metrics; huge names are bounded. The
    namer cleans a name once, as it resolves it (enrich/symbols.py KernelNames)."""
    hostile = {0x10: "k\x1b[2J\x1b]0;t\x07", 0x20: "k\x9b31m\udcff", 0x30: "t<" + "x" * 10000 + ">"}

    class HostileHandles:  # what a process's own KernelHandle records or symbol tables named
        def resolve(self, pid, func):
            return hostile[func], 0

    fake_proc(tmp_path, 9)
    r = request(9, "/a", [cuda(func=f, pid=9) for f in hostile])
    stage(tmp_path, KernelNames(handles=HostileHandles())).process([r])
    assert r.kernel_names[0x10] == "k\ufffd[2J\ufffd]0;t\ufffd"
    assert r.kernel_names[0x20] == "k\ufffd31m\ufffd"
    assert len(r.kernel_names[0x30]) == 4096 and r.kernel_names[0x30].endswith("…")


