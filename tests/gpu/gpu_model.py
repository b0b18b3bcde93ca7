"""The GPU work the gpu tier's servers do, one function per launch path:
eager PyTorch (cuBLAS GEMMs + elementwise kernels, through cudaLaunchKernel and
cuLaunchKernel), torch.compile (Triton kernels through the driver API), and a CUDA graph
replayed with one cudaGraphLaunch. profiled() counts the same work's launches with
torch.profiler, the reference our counts are compared with."""
from __future__ import annotations

import time

import torch

MODEL = torch.nn.Sequential(torch.nn.Linear(256, 512), torch.nn.GELU(), torch.nn.LayerNorm(512),
                            torch.nn.Linear(512, 10), torch.nn.Softmax(dim=-1)).cuda().eval()
X = torch.randn(32, 256, device="cuda")
_compiled = None
_graph = None
_graph_out = None
# Host-side launch calls torch.profiler records (its CPU-side CUDA runtime/driver events).
LAUNCH_CALLS = ("cudaLaunchKernel", "cuLaunchKernel", "cuLaunchKernelEx", "cudaLaunchKernelExC")


def eager() -> None:
    with torch.no_grad():
        MODEL(X)
    torch.cuda.synchronize()


def compiled() -> None:
    """Triton kernels from torch.compile; compiled on first use (tens of seconds)."""
    global _compiled
    if _compiled is None:
        _compiled = torch.compile(MODEL)
    with torch.no_grad():
        _compiled(X)
    torch.cuda.synchronize()


def graph() -> None:
    """Replays the eager forward captured once as a CUDA graph."""
    global _graph, _graph_out
    if _graph is None:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream), torch.no_grad():
            MODEL(X)  # warm-up on a side stream, as torch.cuda.graphs asks
        torch.cuda.current_stream().wait_stream(stream)
        _graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(_graph), torch.no_grad():
            _graph_out = MODEL(X)
    _graph.replay()
    torch.cuda.synchronize()


def copy_in(n: int) -> None:
    """n bytes from pageable host memory to the GPU (cudaMemcpyAsync of n bytes, then a
    stream synchronize): a copy whose size the caller chooses."""
    torch.empty(max(1, min(n, 1 << 20)), dtype=torch.uint8).to("cuda")
    torch.cuda.synchronize()


def tiny_launches(n: int) -> float:
    """n one-element additions (one kernel launch each, nothing else), then a synchronize:
    wall seconds of a loop bound by the host's launch path, where a probe's cost shows whole."""
    x = torch.zeros(1, device="cuda")
    torch.cuda.synchronize()
    start = time.perf_counter()
    for _ in range(max(1, min(n, 200_000))):
        x.add_(1)
    torch.cuda.synchronize()
    return time.perf_counter() - start


def gpu_wait(ms: int) -> float:
    """The GPU kept busy ~`ms` (torch.cuda._sleep spins a kernel for a number of GPU
    cycles), then a synchronize: the seconds the synchronize took, as the thread saw them."""
    cycles = int(max(1, min(ms, 2000)) * 1e-3 * torch.cuda.get_device_properties(0).clock_rate * 1e3)
    torch.cuda._sleep(cycles)
    start = time.perf_counter()
    torch.cuda.synchronize()
    return time.perf_counter() - start


MODES = {"eager": eager, "compiled": compiled, "graph": graph}

_A = None


def gemm() -> None:
    """GPU-bound: four 2048^3 half-precision GEMMs (cuBLAS), then a synchronize."""
    global _A
    if _A is None:
        _A = torch.randn(2048, 2048, device="cuda", dtype=torch.float16)
    for _ in range(4):
        _A @ _A
    torch.cuda.synchronize()


# The routes the device-clock comparison runs (tests/gpu/test_device_clock.py), by shape:
# GPU-bound GEMMs, launch-bound small ops, copy-heavy, a CUDA graph replay.
SHAPES = {"gemm": gemm, "tiny": lambda: tiny_launches(200), "copy": lambda: copy_in(1 << 20), "graph": graph}


def device_seconds(shape: str) -> float:
    """Seconds the GPU spent on one run of SHAPES[shape] (kernels, copies, memsets), as
    torch.profiler (CUPTI) times them: the reference for the collector's device-clock
    seconds. Run once before, so that nothing lazy is counted."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CUDA]) as prof:
        SHAPES[shape]()
    events = [e for e in prof.key_averages() if e.device_type == torch.autograd.DeviceType.CUDA]
    total_us = sum(getattr(e, "self_device_time_total", None) or getattr(e, "self_cuda_time_total", 0)
                   for e in events)
    return total_us / 1e6


def profiled(mode: str) -> dict:
    """The launches torch.profiler sees in one run of `mode` (run once before, so
    nothing lazy is counted): host launch calls, graph launches, GPU kernels."""
    from torch.profiler import ProfilerActivity, profile
    with profile(activities=[ProfilerActivity.CPU, ProfilerActivity.CUDA]) as prof:
        MODES[mode]()
    events = prof.key_averages()
    kernels = [e for e in events if e.device_type == torch.autograd.DeviceType.CUDA
               and not e.key.startswith("Memcpy") and not e.key.startswith("Memset")]
    return {"launches": sum(e.count for e in events if e.key in LAUNCH_CALLS),
            "graph_launches": sum(e.count for e in events if e.key.startswith("cudaGraphLaunch")),
            "gpu_kernels": sum(e.count for e in kernels),
            "kernel_names": sorted({e.key for e in kernels})}


_GROUP = None


def all_reduce(n: int) -> None:
    """One NCCL all_reduce of n float32 through torch.distributed, on a process group of one
    rank (the real libnccl of PyTorch's wheels; set up on first use, outside the timing)."""
    global _GROUP
    import torch.distributed as dist
    if _GROUP is None:
        import socket
        with socket.socket() as s:
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        dist.init_process_group("nccl", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
        _GROUP = dist.group.WORLD
    x = torch.ones(max(1, min(n, 1 << 24)), device="cuda")
    dist.all_reduce(x)
    torch.cuda.synchronize()


def decode_loop(steps: int) -> float:
    """A decode-like loop: `steps` small forwards, each synchronised (as a token loop
    waits for its token). Returns wall seconds; the caller compares traced and untraced."""
    steps = max(1, min(steps, 5000))
    start = time.perf_counter()
    for _ in range(steps):
        eager()
    return time.perf_counter() - start
