"""What the gpu tier reads off a request's spans, and how it prints the issue's targets."""
from __future__ import annotations

import json
import urllib.request

from tests.harness import children_of, server_spans


def request_span(receiver, pid: int, path: str, nth: int = 1):
    """The nth request (by start time) to `path` from process `pid`; waits for it."""
    def found(spans):
        return sorted((s for s in server_spans(spans, pid) if s.attributes.get("url.path") == path),
                      key=lambda s: s.start_ns)
    assert receiver.wait_for(lambda spans: len(found(spans)) >= nth), f"no span for request {nth} to {path}"
    return found(receiver.spans)[nth - 1]


def launch_figures(spans, span) -> tuple[int, int, int]:
    """(launches, kernel launches, kernel launches with a name) among a span's children,
    counted as the span's gpu.launches counts them: kernel launches and graph launches (a
    graph launch runs many kernels and names none itself); a rollup child stands for
    gpu.rollup.count calls."""
    total = kernels = named = 0
    for child in children_of(spans, span):
        a = child.attributes
        graph = a.get("gpu.cuda.call") == "cudaGraphLaunch"
        if "gpu.kernel.func" not in a and not graph:
            continue
        n = a.get("gpu.rollup.count", 1)
        total += n
        if not graph:
            kernels += n
            named += n if a.get("gpu.kernel.name") else 0
    return total, kernels, named


def slow_get(port: int, path: str, timeout: float = 300) -> bytes:
    """A request that may compile (torch.compile): longer than Target.get's 20 s."""
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout).read()


def get_json(port: int, path: str) -> dict:
    return json.loads(slow_get(port, path))


def report(label: str, figures: tuple[int, int, int], profiler: int) -> str:
    """One printed line with the issue's targets: >= 95 % of kernel launches named, count
    within 1 %."""
    ours, kernels, named = figures
    ratio = ours / profiler if profiler else float("nan")
    named_part = (f"named {named}/{kernels} kernel launches = {100 * named / kernels:.1f} % (target >= 95 %)"
                  if kernels else "no kernel launch to name (graph launches only)")
    return f"gpu[{label}]: launches ours={ours} torch.profiler={profiler} ratio={ratio:.3f} (target 0.99-1.01); {named_part}"
