"""How a request of tests/bpf/targets/h2_apps.py (and go/h2c_server.go) encodes its id
N in its calls: a cudaMemcpy of H2D_BASE+N bytes, launches with grid (N, 1, 1), a
cudaMemcpy of D2H_BASE+N bytes. Apart from the servers (which load libcudart) so that a
test can read it without becoming a CUDA process itself."""
from __future__ import annotations

H2D_BASE, D2H_BASE = 100_000, 200_000
CALLS = 6  # the copy, 2 launches, (10 ms asleep), 2 launches, the copy back


def rid_of(span):
    """The request id one of these calls encodes, from its span (None: not one of them)."""
    a = span.attributes
    if span.name == "cudaLaunchKernel":
        return (a.get("gpu.grid") or [None])[0]
    if span.name == "cudaMemcpy":
        n = a.get("gpu.memcpy.bytes", 0)
        return n - D2H_BASE if n >= D2H_BASE else n - H2D_BASE if n >= H2D_BASE else None
    return None
