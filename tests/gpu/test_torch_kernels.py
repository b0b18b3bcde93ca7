"""On a real GPU (scripts/gpu-tier.sh runs this tier on a bare GPU machine): PyTorch
served over HTTP, each launch path in its own request; the trace's launch count is
compared with torch.profiler's for the same work, and the issue's targets are printed:
>= 95 % of launches named, count within 1 % of torch.profiler's, decode loop traced vs
untraced within 2 %. Counts are asserted loosely (a gross miscount fails); the targets
and timings are printed, not asserted (performance is bench's, and names for some launch
paths are still being built)."""
from __future__ import annotations

import statistics
import sys
import time
from collections import Counter
from pathlib import Path

from tests.gpu.gpu_spans import get_json, launch_figures, report, request_span, slow_get
from tests.harness import Target, children_of, serve_traced

HERE = Path(__file__).resolve().parent
AT_DRIVER_WAIT_S = 20.0  # pairs made, 2 s stable, the next review: with room


def _traced(start_collector, script: str, *args: str) -> tuple[object, Target]:
    collector = start_collector(*args)
    return collector, serve_traced(collector, Target([sys.executable, str(HERE / script)]))


def _base_name(name: str) -> str:
    """A kernel's name without its return type, template arguments and parameters, as both
    torch.profiler and the collector demangle it: `void at::native::foo<4>(int)` -> `at::native::foo`."""
    name = name.removeprefix("void ").split("(", 1)[0]
    return name.split("<", 1)[0].strip()


def _one_request(receiver, target, mode: str, capsys) -> tuple[int, int, dict]:
    slow_get(target.port, f"/run/{mode}")  # warm-up: compiles, captures, loads lazily
    slow_get(target.port, f"/run/{mode}")
    span = request_span(receiver, target.pid, f"/run/{mode}", nth=2)
    expected = get_json(target.port, f"/profile/{mode}")
    figures = launch_figures(receiver.spans, span)
    ours, _kernels, named = figures
    assert span.attributes["gpu.launches"] == ours, "span's launch count and its launch children disagree"
    names = {_base_name(n) for c in children_of(receiver.spans, span)
             for n in [c.attributes.get("gpu.kernel.name"), *c.attributes.get("gpu.graph.kernels", ())] if n}
    theirs = {_base_name(n) for n in expected["kernel_names"]}
    with capsys.disabled():
        print("\n" + report(mode, figures, expected["launches"] + expected["graph_launches"]))
        print(f"gpu[{mode} names]: {len(theirs & names)} of torch.profiler's {len(theirs)} kernel names among ours; "
              f"theirs only: {sorted(theirs - names)[:6]}; ours only: {sorted(names - theirs)[:6]}")
        # Which call each launch is named (a launch counted at the driver alone takes the
        # runtime's name by the driver entry it passed: launch_routes.c).
        calls = Counter(c.attributes.get("gpu.cuda.call") for c in children_of(receiver.spans, span))
        print(f"gpu[{mode} calls]: {dict(calls)}")
    if theirs and named:
        assert len(theirs & names) >= 0.9 * len(theirs), (sorted(theirs - names), sorted(names - theirs))
    return ours, named, expected


def test_eager_cublas_gemm_and_elementwise(receiver, start_collector, capsys):
    _, target = _traced(start_collector, "torch_server.py")
    try:
        ours, named, expected = _one_request(receiver, target, "eager", capsys)
        assert ours > 0 and named > 0
        assert 0.9 <= ours / expected["launches"] <= 1.1
    finally:
        target.stop()


def test_eager_launches_counted_at_the_driver_alone_keep_their_names(receiver, start_collector, capsys):
    """Once the collector counts the service's runtime launches at the driver alone (its
    runtime launch probes detached: probes/launch_routes.py), a request's launches are still
    counted and named as torch.profiler sees them. Printed: whether it got there (not where
    the real runtime reaches the driver by no probed entry: then both probes stay)."""
    collector, target = _traced(start_collector, "torch_server.py")
    try:
        at_driver = collector.until_at_driver(target.pid, AT_DRIVER_WAIT_S, lambda: slow_get(target.port, "/run/eager"))
        with capsys.disabled():
            print(f"\ngpu[launch routes]: runtime launches counted at the driver alone: {at_driver}; "
                  + "; ".join(l.strip() for l in collector.log.lines if f"pid {target.pid}:" in l)[-600:])
        for _ in range(10):  # the warm-up's spans in, then none of them left to count as the next
            seen = len(receiver.spans)
            time.sleep(1)
            if len(receiver.spans) == seen:
                break
        receiver.clear()
        ours, named, expected = _one_request(receiver, target, "eager", capsys)
        assert ours > 0 and named > 0
        assert 0.9 <= ours / expected["launches"] <= 1.1
    finally:
        target.stop()


def test_torch_compile_triton_kernels(receiver, start_collector, capsys):
    _, target = _traced(start_collector, "torch_server.py")
    try:
        ours, _named, expected = _one_request(receiver, target, "compiled", capsys)
        assert expected["launches"] > 0 and ours > 0
        assert 0.9 <= ours / expected["launches"] <= 1.1
    finally:
        target.stop()


def test_cuda_graph_replay(receiver, start_collector, capsys):
    _, target = _traced(start_collector, "torch_server.py")
    try:
        _ours, _named, expected = _one_request(receiver, target, "graph", capsys)
        span = request_span(receiver, target.pid, "/run/graph", nth=2)
        calls = [c.attributes.get("gpu.cuda.call") for c in children_of(receiver.spans, span)]
        replayed = span.attributes.get("gpu.graph.kernel_launches")
        with capsys.disabled():
            print(f"gpu[graph]: cudaGraphLaunch ours={calls.count('cudaGraphLaunch')} "
                  f"torch.profiler={expected['graph_launches']}; GPU kernels in the replay: ours={replayed} "
                  f"torch.profiler={expected['gpu_kernels']}")
        assert expected["graph_launches"] == 1
        assert calls.count("cudaGraphLaunch") == 1, calls
        assert replayed == expected["gpu_kernels"], (replayed, expected["gpu_kernels"])
    finally:
        target.stop()


def test_nccl_all_reduce_on_the_real_libnccl_is_the_requests_child(receiver, start_collector, capsys):
    """Issue 46 item 1: one all_reduce through torch.distributed (one rank, NCCL from PyTorch's
    wheels), made in a request: the span's child names it, with its bytes and communicator."""
    _, target = _traced(start_collector, "torch_server.py")
    try:
        slow_get(target.port, "/allreduce/1024")  # the process group's set-up
        slow_get(target.port, "/allreduce/4096")
        span = request_span(receiver, target.pid, "/allreduce/4096")
        nccl = [c.attributes for c in children_of(receiver.spans, span) if c.attributes.get("gpu.nccl.op")]
        with capsys.disabled():
            print(f"\ngpu[nccl]: the request's NCCL children: {nccl}")
        assert [(a["gpu.nccl.op"], a["gpu.nccl.bytes"]) for a in nccl] == [("all_reduce", 4096 * 4)], nccl
        assert nccl[0].get("gpu.nccl.comm.nranks") in (1, None)  # 1 when its init was seen
    finally:
        target.stop()


def test_fastapi_model_server(receiver, start_collector, capsys):
    _, target = _traced(start_collector, "fastapi_server.py")
    try:
        target.get("/predict")
        target.get("/predict")
        span = request_span(receiver, target.pid, "/predict", nth=2)
        expected = get_json(target.port, "/profile")
        figures = launch_figures(receiver.spans, span)
        ours, _kernels, named = figures
        with capsys.disabled():
            print("\n" + report("fastapi", figures, expected["launches"]))
        assert span.attributes["gpu.launches"] == ours > 0 and named > 0
        assert 0.9 <= ours / expected["launches"] <= 1.1
    finally:
        target.stop()


def test_decode_loop_traced_vs_untraced(receiver, start_collector, capsys):
    """The same process's decode loop timed with no collector, traced, and traced without
    the Python context probes, the three phases interleaved over two rounds (sequential
    phases drift on a GPU host: a later phase once ran faster than the untraced one).
    Printed: overhead and cost per launch, against the issue's 2 % target."""
    steps, reps, rounds = 500, 2, 2
    collector, target = _traced(start_collector, "torch_server.py")
    try:
        slow_get(target.port, "/decode/50")  # warm-up
        get_json(target.port, f"/decode/{steps}")
        per_forward = get_json(target.port, "/profile/eager")["launches"]
        span = request_span(receiver, target.pid, f"/decode/{steps}")
        launches = span.attributes["gpu.launches"]
        collector.stop()
        times: dict[str, list[float]] = {"untraced": [], "traced": [], "no contexts": []}
        for _ in range(rounds):
            for phase, args in (("untraced", None), ("traced", ()), ("no contexts", ("--no-python-context",))):
                col = None if args is None else start_collector(*args)
                if col is not None:
                    col.wait_traced(target.pid)
                times[phase] += [get_json(target.port, f"/decode/{steps}")["seconds"] for _ in range(reps)]
                if col is not None:
                    col.stop()
        t, n, u = (statistics.median(times[k]) for k in ("traced", "no contexts", "untraced"))
        with capsys.disabled():
            print(f"\ngpu[decode]: {steps} forwards ({steps * per_forward} launches), median of "
                  f"{rounds}x{reps} interleaved: untraced {u * 1e3:.1f} ms, traced {t * 1e3:.1f} ms "
                  f"({100 * (t - u) / u:+.2f} %, target <= 2 %; {(t - u) / (steps * per_forward) * 1e6:+.2f} us "
                  f"per launch), traced without Python contexts {n * 1e3:.1f} ms ({100 * (n - u) / u:+.2f} %, "
                  f"{(n - u) / (steps * per_forward) * 1e6:+.2f} us per launch); all (ms): "
                  + ", ".join(f"{k} {[round(x * 1e3, 1) for x in v]}" for k, v in times.items())
                  + f"; launches ours={launches} expected={steps * per_forward}")
        assert 0.9 <= launches / (steps * per_forward) <= 1.1
    finally:
        target.stop()


def test_fastapi_concurrent_clients_each_request_its_own_calls(receiver, start_collector, capsys):
    """8 keep-alive clients, 48 requests, each copying its own size to the GPU after the
    forward: every request's span holds exactly its own copy and the forward's launches
    (a round of the same load first, so each worker thread's lazy set-up is done)."""
    from tests.bpf.load_client import fetch_all
    _, target = _traced(start_collector, "fastapi_server.py")
    try:
        fetch_all(target.port, [f"/predict/{2000 + i}" for i in range(48)], concurrency=8, seconds=120)
        target.get("/predict/1")
        per_request = request_span(receiver, target.pid, "/predict/1").attributes["gpu.launches"]
        paths = [f"/predict/{1000 + i}" for i in range(48)]
        out = fetch_all(target.port, paths, concurrency=8, seconds=120)
        assert sorted(out.ok) == sorted(paths), out.errors
        spans = {p: request_span(receiver, target.pid, p) for p in paths}
        launches, copies = {}, {}
        for path, span in spans.items():
            launches[path] = span.attributes["gpu.launches"]
            copies[path] = [c.attributes["gpu.memcpy.bytes"] for c in children_of(receiver.spans, span)
                            if "gpu.memcpy.bytes" in c.attributes]
        wrong = {p: c for p, c in copies.items() if c != [int(p.rsplit("/", 1)[1])]}
        with capsys.disabled():
            print(f"\ngpu[concurrent]: {len(paths)} requests, 8 clients: launches per span "
                  f"{sorted(set(launches.values()))} (one request alone: {per_request}); "
                  f"spans with other than their own one copy: {len(wrong)} {dict(list(wrong.items())[:4])}")
        assert not wrong
        assert set(launches.values()) == {per_request}
    finally:
        target.stop()


def test_the_time_split_sees_the_synchronize(receiver, start_collector, capsys):
    """Issue 48 on a GPU: a request that keeps the GPU busy ~200 ms and then synchronizes;
    the span's time split must hold the synchronize's time, as gpu_sync where the runtime
    blocks in it and as on_cpu where it spins (CUDA's default for a busy wait on few
    threads). The parts add up to the span's duration. Printed beside torch's own figure."""
    _, target = _traced(start_collector, "torch_server.py")  # the time split: on by default
    try:
        get_json(target.port, "/wait/20")  # warm-up: the sleep kernel's first launch
        measured = get_json(target.port, "/wait/200")["sync_seconds"]
        span = request_span(receiver, target.pid, "/wait/200")
        parts = {p: span.attributes.get(f"otel_gpu.time.{p}") for p in ("on_cpu", "cpu_wait", "gpu_sync", "blocked")}
        duration = (span.end_ns - span.start_ns) / 1e9
        with capsys.disabled():
            print(f"\ntime split of a 200 ms GPU wait: {parts}; torch's synchronize {measured:.4f} s; "
                  f"span {duration:.4f} s")
        assert None not in parts.values(), span.attributes
        assert sum(parts.values()) <= duration + 1e-6
        assert parts["gpu_sync"] + parts["on_cpu"] >= 0.8 * measured  # the wait is in one of them
    finally:
        target.stop()
