"""Where a runtime launch is counted (bpf/launch_routes.c), with the real probes in the
real kernel: the stand-in libcudart passes the stand-in libcuda a handle of its own for
each host stub (as the real runtime does on a GPU). While the runtime's launch probes and
their learners are attached, each launch is counted once by the runtime's probe and the
driver pairs the handle with the func; once they are detached, the driver's probe alone
counts each launch in the runtime's name, with the paired func, the runtime's dims, and
one BPF program run a launch. A handle with no pair is counted all the same, carrying
itself, and counted as unpaired for the process."""
from __future__ import annotations

import ctypes as ct
import sys
from concurrent.futures import ThreadPoolExecutor

import pytest

from bench import bpfstats
from otel_gpu import proc
from otel_gpu.cuda_calls import DRIVER, RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS, call_id
from otel_gpu.kernel_io.abi import CNT_DRIVER_AS_RUNTIME, CNT_DRIVER_DEDUPED
from otel_gpu.probes import runtime_text
from otel_gpu.probes.closer import ProbeCloser
from otel_gpu.probes.launch_routes import at_driver_line
from otel_gpu.ratelimit import Stats
from otel_gpu.records import GraphCall, LaunchCall
from tests.bpf.probe_harness import Child, Probes, build_driver_stubs, build_stub
from tests.bpf.test_graph_probes import CHILD as GRAPH_CHILD, EXEC, STREAM
from tests.harness import TARGETS, Target, children_of, server_spans

# Each call's launches carry the kernel (func), grid and block the test chose, so a launch
# counted under another's func or dims fails.
CHILD = r'''
import ctypes as ct, json, struct, sys
drv, rt, lib = (ct.CDLL(p) for p in sys.argv[1:4])
vp, u, size_t = ct.c_void_p, ct.c_uint, ct.c_size_t
class Dim3(ct.Structure):
    _fields_ = [("x", u), ("y", u), ("z", u)]
rt.cudaLaunchKernel.argtypes = [vp, Dim3, Dim3, vp, size_t, vp]
rt.cudaLaunchKernelExC.argtypes = [vp, vp, vp]
lib.stub_library_launch.argtypes = [vp] + [u] * 7

def launches(func, n, gx):
    return [rt.cudaLaunchKernel(func, Dim3(gx, 2, 1), Dim3(64, 1, 1), None, 0, None) for _ in range(n)]

def exc(func, gx):
    cfg = ct.create_string_buffer(struct.pack("<6IQQQI4x", gx, 2, 1, 64, 1, 1, 0, 0, 0, 0))
    return [rt.cudaLaunchKernelExC(cfg, func, None)]

def library(func, gx):
    return [lib.stub_library_launch(func, gx, 2, 1, 64, 1, 1, 0)]

print(json.dumps({"ready": True}), flush=True)
for line in sys.stdin:
    name, *args = line.split()
    print(json.dumps(globals()[name](*map(int, args))), flush=True)
'''
F, G = 0x7000, 0x7100  # two host stubs (never called: the stand-in launches nothing)


class Links:
    """One kind of row of one file, for one process: attached, and detached at will. The
    learners go with the process's `launch_learning` entry, as user space keeps it
    (probes/launch_routes.py): set before they attach, gone before they detach."""

    def __init__(self, probes: Probes, kind: str, path: str, pid: int) -> None:
        self.learning = (kind == RUNTIME_LEARNERS) and pid
        if self.learning:
            probes.set("launch_learning", pid, ct.c_uint8(1))
        before = len(probes.handles)
        assert probes.attach(kind, path, pid) >= 1, kind
        self.handles, self.probes = probes.handles[before:], probes

    def detach(self) -> None:
        if self.learning:
            self.probes.unset("launch_learning", self.learning)
        closer = ProbeCloser(self.probes.bpf, Stats())
        closer.detach_all(self.handles)
        assert closer.wait(60)
        self.probes.handles = [h for h in self.probes.handles if h not in self.handles]


@pytest.fixture
def child(probes, tmp_path):
    drv, rt, lib = build_driver_stubs(tmp_path, "libcudart.so.12")
    c = Child([sys.executable, "-c", CHILD, drv, rt, lib])
    c.runtime = rt
    assert probes.attach(DRIVER, drv, c.pid) >= 2
    c.launches = Links(probes, RUNTIME_LAUNCHES, rt, c.pid)
    c.learners = Links(probes, RUNTIME_LEARNERS, rt, c.pid)
    ranges = runtime_text.runtime_ranges(proc.maps("/proc", c.pid), {rt})
    runtime_text.write(probes.bpf["runtime_text"], c.pid, ranges)
    probes.set("traced", c.pid, ct.c_uint32(1))
    yield c
    c.stop()
    for table in ("runtime_text", "http_active", "traced", "launch_routes", "launch_learning"):
        probes.unset(table, c.pid)


def _counter(probes: Probes, idx: int) -> int:
    return sum(probes.bpf["counters"][ct.c_int(idx)])


def _launches(probes: Probes, pid: int) -> list:
    return [(r.name, r.func, r.grid) for r in probes.of(pid) if isinstance(r, LaunchCall)]


def _pairs(probes: Probes, pid: int) -> dict:
    return {k.handle: v.value for k, v in probes.bpf["launch_pairs"].items() if k.tgid == pid}


def _route(probes: Probes, pid: int) -> tuple:
    r = probes.bpf["launch_routes"].get(ct.c_uint32(pid))
    return (r.paired, r.unpaired) if r else (0, 0)


def _graphs_reached(probes: Probes, pid: int) -> int:
    r = probes.bpf["launch_routes"].get(ct.c_uint32(pid))
    return r.graphs if r else 0


def _runs(probes: Probes) -> dict:
    """Runs of the launch programs so far (kernel.bpf_stats_enabled: on around the calls)."""
    out = {}
    for name in ("cuda_launch_kernel", "cuda_launch_kernel_exc", "cu_launch_kernel", "cu_launch_kernel_ex",
                 "runtime_launch_learn", "runtime_launch_exc_learn"):
        fn = probes.bpf.funcs.get(name.encode())
        if fn is None:
            out[name] = 0
            continue
        with open(f"/proc/self/fdinfo/{fn.fd}") as f:
            out[name] = int(dict(line.split(":", 1) for line in f if ":" in line)["run_cnt"])
    return out


@pytest.fixture
def bpf_stats():
    with bpfstats.enabled():  # kernel.bpf_stats_enabled: the programs' run counts
        yield


RT, EXC, CU = "cudaLaunchKernel", "cudaLaunchKernelExC", "cuLaunchKernel"


def test_learned_then_counted_at_the_driver_alone(probes, child, bpf_stats):
    probes.set("http_active", child.pid, ct.c_int64(1))  # streamed, as during a request
    deduped, as_runtime = _counter(probes, CNT_DRIVER_DEDUPED), _counter(probes, CNT_DRIVER_AS_RUNTIME)
    # Learning: both probes run; each runtime launch is counted once, by the runtime's.
    assert child.run(f"launches {F} 3 5") + child.run(f"exc {F} 6") + child.run(f"library {F} 7") == [0] * 5
    assert _launches(probes, child.pid) == [(RT, F, (5, 2, 1))] * 3 + [(EXC, F, (6, 2, 1)), (CU, F, (7, 2, 1))]
    assert _counter(probes, CNT_DRIVER_DEDUPED) == deduped + 4
    pairs = _pairs(probes, child.pid)
    assert list(pairs.values()) == [F] and F not in pairs, pairs  # the stand-in's own handle, paired
    assert _route(probes, child.pid) == (1, 0)
    assert probes.bpf["launch_routes"][ct.c_uint32(child.pid)].kept == 4  # the learners' runs

    # The runtime's launch probes and learners go: the driver's probe counts each launch
    # in the runtime's name, with the paired func and the runtime's dims, one run each.
    child.launches.detach()
    child.learners.detach()
    before = _runs(probes)
    assert child.run(f"launches {F} 4 8") + child.run(f"exc {F} 9") + child.run(f"library {F} 10") == [0] * 6
    runs = {k: v - before[k] for k, v in _runs(probes).items()}
    assert runs == {"cuda_launch_kernel": 0, "cuda_launch_kernel_exc": 0, "cu_launch_kernel": 5,
                    "cu_launch_kernel_ex": 1, "runtime_launch_learn": 0, "runtime_launch_exc_learn": 0}, runs
    assert _launches(probes, child.pid)[5:] == [(RT, F, (8, 2, 1))] * 4 + [(EXC, F, (9, 2, 1)), (CU, F, (10, 2, 1))]
    assert _counter(probes, CNT_DRIVER_AS_RUNTIME) == as_runtime + 5
    assert _counter(probes, CNT_DRIVER_DEDUPED) == deduped + 4

    # A kernel first launched now has no pair: counted, carrying its handle, and counted
    # as unpaired for the process (user space then attaches the runtime's probes again).
    assert child.run(f"launches {G} 2 11") == [0, 0]
    got = _launches(probes, child.pid)[11:]
    assert [(n, grid) for n, _, grid in got] == [(RT, (11, 2, 1))] * 2
    assert len({func for _, func, _ in got}) == 1 and got[0][1] not in (F, G, *pairs)
    assert _route(probes, child.pid) == (1, 2)


PAIR_MIX, U64 = 0x9E3779B97F4A7C15, (1 << 64) - 1


def _check(tgid: int, handle: int, func: int) -> int:
    """bpf/launch_routes.c pair_check: what makes a slot whole."""
    return (((handle ^ (func * PAIR_MIX & U64) ^ tgid) * PAIR_MIX) & U64) >> 32


def test_the_pair_cache_is_read_first_and_a_spoiled_slot_is_a_miss(probes, child):
    """launch_pair_cache in front of launch_pairs: a whole slot names the launch without
    the hash; fields of two pairs (a slot read while another CPU writes it) or another
    process's pair in the slot are a miss, which the hash answers and writes back."""
    probes.set("http_active", child.pid, ct.c_int64(1))
    child.run(f"launches {F} 1 5")  # learnt: the pair, and its slot
    (handle,) = _pairs(probes, child.pid)
    child.launches.detach()
    child.learners.detach()
    cache = probes.bpf["launch_pair_cache"]
    ((slot, pair),) = [(k.value, v) for k, v in cache.items() if v.tgid == child.pid]
    assert (pair.handle, pair.func, pair.check) == (handle, F, _check(child.pid, handle, F))

    def put(tgid: int, func: int, check: int) -> None:
        cache[ct.c_int(slot)] = cache.Leaf(handle=handle, func=func, tgid=tgid, check=check)

    put(child.pid, G, pair.check)  # torn: G with F's check
    child.run(f"launches {F} 1 6")
    assert cache[ct.c_int(slot)].func == F  # written back from the hash
    put(child.pid, G, _check(child.pid, handle, G))  # whole: believed before the hash
    child.run(f"launches {F} 1 7")
    put(child.pid + 1, G, _check(child.pid + 1, handle, G))  # another process's pair
    child.run(f"launches {F} 1 8")
    assert [(func, grid[0]) for _, func, grid in _launches(probes, child.pid)] == [(F, 5), (F, 6), (G, 7), (F, 8)]


def test_no_pair_is_made_once_the_learners_go(probes, child):
    """A func a learner kept for a launch that never reached the driver (it failed first),
    then the learners gone before the runtime's probe: the next marked pass pairs nothing
    (`launch_learning` is gone), where it would have paired its handle with the stale func."""
    probes.set("http_active", child.pid, ct.c_int64(1))
    tid_func = probes.bpf["launch_funcs"]
    child.learners.detach()  # learning off, as user space does before they detach
    child.run(f"launches {F} 1 5")  # marked by the runtime's probe; no learner ran
    tid = next(iter(probes.of(child.pid))).tid
    tid_func[ct.c_uint32(tid)] = ct.c_uint64(G)  # a stale func, as a failed launch leaves
    child.run(f"launches {F} 2 6")
    assert _pairs(probes, child.pid) == {} and _route(probes, child.pid) == (0, 0)
    assert [(n, func) for n, func, _ in _launches(probes, child.pid)] == [(RT, F)] * 3


def test_counted_outside_requests_too(probes, child):
    """Outside requests (the launch slots and rollup): the same counts, under the func."""
    child.run(f"launches {F} 2 5")  # learnt
    child.launches.detach()
    child.learners.detach()
    child.run(f"launches {F} 5 5")
    child.run(f"library {F} 5")
    counts = {}
    for (call, detail), (n, _bytes, _ns) in probes.rollup(child.pid).items():
        counts[(call, detail)] = counts.get((call, detail), 0) + n
    assert counts == {(call_id(RT), F): 7, (call_id(CU), F): 1}
    assert probes.of(child.pid) == []


def test_a_runtime_probe_back_counts_once_and_pairs(probes, child):
    """Detached, then attached again (as user space does on an unpaired handle): every
    launch counted exactly once through both changes, and the new kernel paired."""
    probes.set("http_active", child.pid, ct.c_int64(1))
    child.launches.detach()
    child.learners.detach()
    child.run(f"launches {G} 2 3")  # no pair yet: counted at the driver, with its handle
    child.learners = Links(probes, RUNTIME_LEARNERS, child.runtime, child.pid)
    child.launches = Links(probes, RUNTIME_LAUNCHES, child.runtime, child.pid)
    child.run(f"launches {G} 3 4")  # the runtime's probe counts; the driver pairs
    child.launches.detach()
    child.learners.detach()
    child.run(f"launches {G} 2 5")  # paired now: the driver counts them under G
    got = _launches(probes, child.pid)
    assert [grid[0] for _, _, grid in got] == [3, 3, 4, 4, 4, 5, 5]
    assert [func for _, func, _ in got][2:] == [G] * 5 and got[0][1] == got[1][1] != G
    assert _pairs(probes, child.pid) == {got[0][1]: G}
    assert _route(probes, child.pid) == (1, 2)


# --- End to end: the collector decides when the runtime's probes go and come back ---------

A, B = "vec_add(float*, int)", "scale(float*, int)"


def _expected(request_id: int, kernels: str) -> list:
    """(call, kernel name, grid) of each launch routed_http.py makes for the request."""
    out = []
    for k, letter in enumerate(kernels):
        name = {"a": A, "b": B}[letter]
        out += [(RT, name, (request_id, k + 1, 1))] * 2 + [(EXC, name, (request_id, k + 1, 2))]
    return sorted(out, key=_order)


def _order(launch: tuple) -> tuple:
    name, kernel, grid = launch
    return name, grid, kernel or ""


def _children(receiver, pid: int, request_id: int) -> list:
    span = next(s for s in server_spans(receiver.spans, pid) if s.attributes.get("url.path", "").split("/")[2:3]
                == [str(request_id)])
    return sorted(((k.name, k.attributes.get("gpu.kernel.name"), tuple(k.attributes["gpu.grid"]))
                   for k in children_of(receiver.spans, span)), key=_order)


def _serve(target, receiver, plan: dict) -> None:
    """Requests {id: kernels} from 8 clients at once; waits for every span."""
    with ThreadPoolExecutor(8) as pool:
        list(pool.map(lambda i: target.get(f"/launch/{i}/{plan[i]}"), plan))
    assert receiver.wait_for(lambda spans: {s.attributes.get("url.path") for s in server_spans(spans, target.pid)}
                             >= {f"/launch/{i}/{k}" for i, k in plan.items()})


def test_the_collector_detaches_the_runtime_probes_and_brings_them_back(tmp_path, receiver, start_collector):
    """A process started before the collector. While its runtime probes learn, then once
    the driver's probe counts alone, then for a kernel first launched after, and once that
    one is learned: every span's launches are its own (its id in the grid), named, counted
    once; the kernel counters say which probe counted each."""
    libcuda, cudart, _ = build_driver_stubs(tmp_path, "libcudart.so.12")
    env = {"STUB_LIBCUDA": libcuda, "STUB_CUDART": cudart}
    target = Target([sys.executable, str(TARGETS / "routed_http.py")], env)
    try:
        collector = start_collector()
        collector.wait_traced(target.pid)
        target.go()
        at_driver = at_driver_line(target.pid)
        learning = {i: "a" for i in range(1, 9)}  # vec_add learned; 3 launches a request
        _serve(target, receiver, learning)
        assert collector.log.wait_for(at_driver, 30), collector.log.lines[-20:]
        alone = {i: "a" for i in range(9, 25)}
        _serve(target, receiver, alone)
        assert collector.log.wait_for(f"pid {target.pid}: a kernel launched with no paired handle", 1) is False
        new = {25: "ab"}  # scale first launched now: its handle has no pair
        _serve(target, receiver, new)
        assert collector.log.wait_for(f"pid {target.pid}: a kernel launched with no paired handle", 30)
        relearn = {26: "ab"}
        _serve(target, receiver, relearn)
        assert collector.log.wait_for(at_driver, 30, count=2), collector.log.lines[-20:]
        after = {i: "ba" for i in range(27, 35)}
        _serve(target, receiver, after)
        for plan in (learning, alone, relearn, after):
            for i, kernels in plan.items():
                assert _children(receiver, target.pid, i) == _expected(i, kernels), i
        # Request 25: scale's launches carry its handle, unnamed; vec_add's are paired.
        assert [(n, name if grid[1] == 1 else None, grid) for n, name, grid in _children(receiver, target.pid, 25)] \
            == [(n, name if grid[1] == 1 else None, grid) for n, name, grid in _expected(25, "ab")]
    finally:
        target.stop()
    assert collector.stop() == 0
    counted = collector.counts()["counted"]
    runtime = 3 * (len(learning) + 2 * len(relearn))  # both probes ran: the driver's dropped its pass
    driver = 3 * (len(alone) + 2 * len(new) + 2 * len(after))
    assert counted.get("driver_launches_deduped") == runtime and counted.get("driver_launches_as_runtime") == driver


def test_graph_launches_through_the_driver_count_once_either_way(probes, tmp_path):
    """cudaGraphLaunch reaching cuGraphLaunch (the exec is the same handle for both: no
    pairing): dropped at the driver while the runtime's probe marks the thread, and, while
    the process learns, counted as reaching it (user space then detaches the runtime's
    graph launch probes); counted there as the cudaGraphLaunch once it is detached; a
    library's own cuGraphLaunch of the same exec counts on its own throughout."""
    drv = build_stub(tmp_path, "stub_libcuda_graphs.c", "libcuda.so.1")
    rt = build_stub(tmp_path, "stub_cudart_graphs.c", "libcudart.so.12")
    c = Child([sys.executable, "-c", GRAPH_CHILD, drv, rt, str(EXEC), str(STREAM)])
    try:
        assert probes.attach(DRIVER, drv, c.pid) >= 2
        launches = Links(probes, RUNTIME_GRAPH_LAUNCHES, rt, c.pid)
        runtime_text.write(probes.bpf["runtime_text"], c.pid,
                           runtime_text.runtime_ranges(proc.maps("/proc", c.pid), {rt}))
        probes.set("traced", c.pid, ct.c_uint32(1))
        probes.set("http_active", c.pid, ct.c_int64(1))
        deduped, as_runtime = _counter(probes, CNT_DRIVER_DEDUPED), _counter(probes, CNT_DRIVER_AS_RUNTIME)
        gcall, cucall = call_id("cudaGraphLaunch"), call_id("cuGraphLaunch")
        assert c.run("through") == [0] * 6
        assert _graphs_reached(probes, c.pid) == 0  # not learning: not kept
        probes.set("launch_learning", c.pid, ct.c_uint8(1))
        assert c.run("through") == [0] * 6
        assert _graphs_reached(probes, c.pid) == 3
        probes.unset("launch_learning", c.pid)
        launches.detach()
        assert c.run("through") == [0] * 6
        got = [(r.call, r.graph_exec, r.stream) for r in probes.of(c.pid) if isinstance(r, GraphCall)]
        assert got == [(gcall, EXEC, STREAM), (cucall, EXEC, STREAM)] * 9
        assert _counter(probes, CNT_DRIVER_DEDUPED) == deduped + 6
        assert _counter(probes, CNT_DRIVER_AS_RUNTIME) == as_runtime + 3
    finally:
        c.stop()
        for table in ("runtime_text", "http_active", "traced", "launch_routes", "launch_learning"):
            probes.unset(table, c.pid)
