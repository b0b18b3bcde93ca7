"""NCCL collectives as child spans, end to end through `otel-gpu run`: the real probes on
a stub libnccl.so.2 (tests/bpf/targets/stub_libnccl.c: the real symbols and signatures;
the real library needs a GPU to make a communicator), and the same stub as ROCm's
librccl.so.1 (RCCL exports NCCL's API: its calls are NCCL calls), an HTTP service whose requests
make known collectives (tests/bpf/targets/nccl_http.py), 4 clients at once. Every
request must have exactly its own calls with their op, bytes, datatype, reduction,
root/peer, communicator (size and rank learnt at its init), stream and group; calls made
while no request is open are counted, not lost."""
from __future__ import annotations

import subprocess
import sys

import pytest
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

from tests.harness import TARGETS, Target, children_of, server_spans

REQUESTS = 12
OUTSIDE = 5


def _stub(tmp_path: Path, name: str) -> str:
    out = tmp_path / name
    subprocess.run(["gcc", "-shared", "-fPIC", "-o", str(out), str(TARGETS / "stub_libnccl.c")], check=True)
    return str(out)


def _expected(k: int) -> list[dict]:
    """What request k's children must say (nccl_http.py collect), in call order."""
    stream = hex(0x5000 + k)
    a = {"gpu.nccl.comm.nranks": 4, "gpu.nccl.comm.rank": 1}
    return [
        {"gpu.nccl.op": "all_reduce", "gpu.nccl.count": 1000 + k, "gpu.nccl.bytes": (1000 + k) * 4,
         "gpu.nccl.datatype": "float32", "gpu.nccl.reduction": "sum", **a},
        # received: sendcount x nranks
        {"gpu.nccl.op": "all_gather", "gpu.nccl.count": 10 + k, "gpu.nccl.bytes": (10 + k) * 2 * 4,
         "gpu.nccl.datatype": "bfloat16", **a},
        {"gpu.nccl.op": "reduce_scatter", "gpu.nccl.count": 20 + k, "gpu.nccl.bytes": (20 + k) * 8,
         "gpu.nccl.datatype": "int64", "gpu.nccl.reduction": "max",
         "gpu.nccl.comm.nranks": 2, "gpu.nccl.comm.rank": 0},
        {"gpu.nccl.op": "broadcast", "gpu.nccl.count": 30 + k, "gpu.nccl.bytes": 30 + k, "gpu.nccl.datatype": "uint8",
         "gpu.nccl.root": k % 4, "gpu.nccl.comm.nranks": 2, "gpu.nccl.comm.rank": 1},
        {"gpu.nccl.op": "reduce", "gpu.nccl.count": 40 + k, "gpu.nccl.bytes": (40 + k) * 8,
         "gpu.nccl.datatype": "float64", "gpu.nccl.reduction": "avg", "gpu.nccl.root": 2, **a},
        {"gpu.nccl.op": "send", "gpu.nccl.count": 50 + k, "gpu.nccl.bytes": (50 + k) * 4, "gpu.nccl.datatype": "int32",
         "gpu.nccl.peer": 3, **a},
        # its communicator's init was never seen: no size or rank, rather than a guess
        {"gpu.nccl.op": "recv", "gpu.nccl.count": 60 + k, "gpu.nccl.bytes": (60 + k) * 2,
         "gpu.nccl.datatype": "float16", "gpu.nccl.peer": 0, "gpu.nccl.comm": hex(0x7F00DEAD0000)},
    ]


KEYS = ("gpu.nccl.op", "gpu.nccl.count", "gpu.nccl.bytes", "gpu.nccl.datatype", "gpu.nccl.reduction",
        "gpu.nccl.root", "gpu.nccl.peer", "gpu.nccl.comm.nranks", "gpu.nccl.comm.rank")


def _route_k(span) -> int:
    return int(span.attributes["url.path"].rsplit("/", 1)[1])


@pytest.mark.parametrize("library", ["libnccl.so.2", "librccl.so.1"])
def test_each_request_gets_exactly_its_collectives(tmp_path, receiver, start_collector, targets, library):
    collector = start_collector()
    target = Target([sys.executable, str(TARGETS / "nccl_http.py")], {"STUB_LIBNCCL": _stub(tmp_path, library)})
    targets.append(target)
    collector.wait_traced(target.pid, 60)  # generous: the bpf tier shares 2 cores
    assert collector.log.wait_for(library, 60), f"stub {library} not probed"
    target.go()
    with ThreadPoolExecutor(4) as pool:
        assert list(pool.map(lambda k: target.get(f"/collect/{k}"), range(1, REQUESTS + 1))) == [b"ok"] * REQUESTS

    def mine(spans):
        return [s for s in server_spans(spans, target.pid) if s.attributes["url.path"].startswith("/collect/")]
    assert receiver.wait_for(lambda s: len(mine(s)) == REQUESTS, 60), collector.log.lines
    groups = set()
    for span in mine(receiver.spans):
        k = _route_k(span)
        kids = sorted((c for c in children_of(receiver.spans, span)
                       if str(c.attributes.get("gpu.cuda.call", "")).startswith("nccl")), key=lambda c: c.start_ns)
        want = _expected(k)
        assert [{key: c.attributes[key] for key in KEYS if key in c.attributes} for c in kids] == \
            [{key: w[key] for key in KEYS if key in w} for w in want], f"request {k}"
        assert {c.attributes["gpu.stream"] for c in kids} == {hex(0x5000 + k)}
        assert kids[6].attributes["gpu.nccl.comm"] == hex(0x7F00DEAD0000)
        assert {c.attributes["otel_gpu.attribution"] for c in kids} == {"thread"}
        # the group: all_gather and reduce_scatter share one, the others are in none
        assert kids[1].attributes["gpu.nccl.group"] == kids[2].attributes["gpu.nccl.group"]
        assert not any("gpu.nccl.group" in kids[i].attributes for i in (0, 3, 4, 5, 6))
        groups.add(kids[1].attributes["gpu.nccl.group"])
        assert span.attributes["gpu.nccl.calls"] == 7
        assert span.attributes["gpu.nccl.total_bytes"] == sum(w["gpu.nccl.bytes"] for w in want)
    assert len(groups) == REQUESTS  # each request's group is its own

    # No request open now: these are counted (in the kernel or on an outside window), not lost.
    target.proc.stdin.write(f"outside {OUTSIDE}\n")
    target.proc.stdin.flush()
    assert target.log.wait_for("outside done", 60)

    def outside(spans):
        return sum(s.attributes.get("gpu.nccl.calls", 0) for s in spans
                   if s.attributes.get("process.pid") == target.pid
                   and s.attributes.get("otel_gpu.attribution") == "outside")
    assert receiver.wait_for(lambda s: outside(s) >= OUTSIDE, 60), collector.log.lines
    assert outside(receiver.spans) == OUTSIDE
