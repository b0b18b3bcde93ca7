"""On a real GPU: a PyTorch model served over HTTP; the trace shows its kernels by
name, and our launch count for one request is compared with torch.profiler's."""
from __future__ import annotations

import json
import sys
from pathlib import Path

from tests.harness import Target, children_of, server_spans

HERE = Path(__file__).resolve().parent


def test_torch_request_kernels_named_and_counted(receiver, start_collector, capsys):
    collector = start_collector()
    target = Target([sys.executable, str(HERE / "torch_server.py")])
    try:
        collector.wait_traced(target.pid)
        target.go()
        target.get("/predict")
        expected = json.loads(target.get("/profile"))["launches"]
        assert receiver.wait_for(lambda s: any(x.attributes.get("http.route") == "/predict"
                                               for x in server_spans(s, target.pid)))
        span = next(x for x in server_spans(receiver.spans, target.pid) if x.attributes["http.route"] == "/predict")
        ours = span.attributes["gpu.launches"]
        names = {k.attributes.get("gpu.kernel.name") for k in children_of(receiver.spans, span)} - {None}
        ratio = ours / expected if expected else float("nan")
        with capsys.disabled():
            print(f"\ngpu: launches ours={ours} torch.profiler={expected} ratio={ratio:.3f}; "
                  f"{len(names)} kernel names, e.g. {sorted(names)[:3]}")
        assert ours > 0 and names
        assert 0.9 <= ratio <= 1.1
    finally:
        target.stop()
