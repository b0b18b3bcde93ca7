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


def launch_figures(spans, span) -> tuple[int, int]:
    """(launches, launches with a kernel name) among a span's children, counted as the
    span's gpu.launches counts them: kernel launches and graph launches; a rollup child
    stands for gpu.rollup.count calls."""
    total = named = 0
    for child in children_of(spans, span):
        a = child.attributes
        if "gpu.kernel.func" not in a and a.get("gpu.cuda.call") != "cudaGraphLaunch":
            continue
        n = a.get("gpu.rollup.count", 1)
        total += n
        named += n if a.get("gpu.kernel.name") else 0
    return total, named


def slow_get(port: int, path: str, timeout: float = 300) -> bytes:
    """A request that may compile (torch.compile): longer than Target.get's 20 s."""
    return urllib.request.urlopen(f"http://127.0.0.1:{port}{path}", timeout=timeout).read()


def get_json(port: int, path: str) -> dict:
    return json.loads(slow_get(port, path))


def report(label: str, ours: int, named: int, profiler: int) -> str:
    """One printed line with the issue's targets: >= 95 % named, count within 1 %."""
    named_pct = 100 * named / ours if ours else 0.0
    ratio = ours / profiler if profiler else float("nan")
    return (f"gpu[{label}]: launches ours={ours} torch.profiler={profiler} ratio={ratio:.3f} (target 0.99-1.01); "
            f"named {named}/{ours} = {named_pct:.1f} % (target >= 95 %)")
