"""Batch steps linked and charged to the requests in their batch (issue 25), on a
vLLM-shaped pair from real parts (tests/bpf/targets/engine_pair.py): a FastAPI/uvicorn
front-end streaming tokens over SSE (and a non-streaming route beside it), and an engine
process it spawns doing continuous batching over ZMQ with a bounded batch (requests
queue), the engine's steps making real libcudart calls (grid (step, 1, 1)) and logging
their members. 1, 8 and 16 clients; every request generates 2-6 tokens. Asserted:
  - every step is a `shared` window, and every member of the step is linked to it (98 %
    at least: a front-end that relays a step's tokens late misses a link);
  - a streaming request is linked only to steps it was in (queued, or done in the
    engine and still closing: not linked), so it gets no share of other steps; at least
    95 % of all links are members of their step;
  - non-streaming requests are linked by overlap (said so on the link) until their answer;
  - each window's split adds up to its GPU seconds; no CUDA call under a request;
  - `otel-gpu report` gives the streaming route's cost per response chunk (token)."""
from __future__ import annotations

import json
import re
import subprocess
import sys
from collections import Counter

import pytest

from tests.bpf.load_client import fetch_all
from tests.harness import ROOT, TARGETS, Target, children_of, server_spans

PYTHON = ROOT / ".venv-debian" / "bin" / "python"
LEVELS = {1: 6, 8: 32, 16: 48}  # clients -> requests
STEP_RE = re.compile(r"step (\d+) ids ((?:\d+ ?)+)$")
PATH_RE = re.compile(r"/(stream|complete)/(\d+)$")


def _paths(first: int, n: int) -> dict:
    """path -> (request id, streams); every 4th request answers in one response."""
    out = {}
    for rid in range(first, first + n):
        kind = "complete" if rid % 4 == 0 else "stream"
        out[f"/{kind}/{rid}?tokens={2 + rid % 5}"] = (rid, kind == "stream")
    return out


@pytest.mark.skipif(not PYTHON.exists(), reason=".venv-debian is missing (scripts/setup.sh builds it)")
def test_each_step_is_linked_and_charged_to_its_batch(tmp_path, receiver, start_collector):
    db = str(tmp_path / "otel-gpu.db")
    collector = start_collector("--gpu-price", "3.6", OTEL_GPU_STORE=db)
    front = Target([str(PYTHON), str(TARGETS / "engine_pair.py"), "0"])
    try:
        engine = int(next(l for l in front.log.lines if "listening on" in l).split()[4])
        collector.wait_traced(engine)
        collector.wait_traced(front.pid)
        front.go()
        streams: dict[int, bool] = {}
        first = 1
        for clients, n in LEVELS.items():
            paths = _paths(first, n)
            first += n
            out = fetch_all(front.port, list(paths), clients, 60)
            assert len(out.ok) == n and not out.errors, out.errors[:5]
            streams.update(paths.values())
        assert receiver.wait_for(lambda spans: len(server_spans(spans, front.pid)) >= len(streams), 30)
        assert collector.stop() == 0  # the last windows go out
    finally:
        front.stop()
    steps = {int(m.group(1)): {int(i) for i in m.group(2).split()}
             for m in (STEP_RE.search(l.strip()) for l in front.log.lines) if m}
    assert sorted(set().union(*steps.values())) == sorted(streams)
    assert max(len(m) for m in steps.values()) == 4, "the batch never filled: nothing queued"

    spans = receiver.spans
    servers = {}
    for s in server_spans(spans, front.pid):
        m = PATH_RE.match(s.attributes.get("url.path", ""))
        if m:
            servers[int(m.group(2))] = s
            assert children_of(spans, s) == [] and s.attributes["gpu.calls"] == 0
    assert sorted(servers) == sorted(streams)
    rid_of = {(s.trace_id, s.span_id): rid for rid, s in servers.items()}
    windows = [s for s in spans if s.parent_span_id == "" and s.attributes.get("process.pid") == engine
               and s.attributes.get("otel_gpu.attribution") == "shared"]
    by_step = {}
    for w in windows:
        grids = {k.attributes["gpu.grid"][0] for k in children_of(spans, w) if k.name == "cudaLaunchKernel"}
        assert len(grids) == 1, grids  # one window per step, cut at its synchronise
        by_step[grids.pop()] = w
    assert sorted(by_step) == sorted(steps)

    links = Counter()   # (link rule, member of the step?) -> links
    unlinked, strays = [], []
    for k, w in sorted(by_step.items()):
        rules = {rid_of[l]: a.get("otel_gpu.link.rule") for l, a in zip(w.links, w.link_attributes)}
        unlinked += [(k, rid) for rid in steps[k] - set(rules)]
        for rid, rule in rules.items():
            member = rid in steps[k]
            links[(rule, member)] += 1
            if streams[rid] and not (member and rule == "batch_member"):
                strays.append((k, rid, rule))
            assert rule in ("batch_member", "overlap"), rule
        split = w.attributes["otel_gpu.cost.split.gpu_seconds"]
        assert len(split) == len(w.links)
        assert sum(split) == pytest.approx(w.attributes["otel_gpu.cost.gpu_seconds"], rel=1e-9, abs=1e-12)
    total = sum(links.values())
    members = sum(n for (_, member), n in links.items() if member)
    evidence = links[("batch_member", True)] + links[("batch_member", False)]
    print(f"{len(steps)} steps, {total} links, {members} to members (precision {members / total:.3f}; of the links "
          f"by evidence {links[('batch_member', True)] / evidence:.3f}); by rule and membership {dict(links)}; "
          f"requests {len(streams)} ({sum(streams.values())} streaming)")
    print(f"members not linked {unlinked[:10]} ({len(unlinked)}); streams linked to a step they were not in "
          f"{strays[:10]} ({len(strays)})")
    # A front-end that relays a step's tokens only after the next step ended (a starved
    # CPU: seen once in a full suite on 2 cores, 2 of 278 members) leaves those members
    # unlinked from that step (docs/attribution.md, what the rules assume): a link
    # missed, never a wrong one (strays).
    assert not strays
    assert len(unlinked) <= 0.02 * sum(len(m) for m in steps.values()), unlinked
    assert links[("batch_member", True)] >= 0.95 * evidence
    chunks = [servers[rid].attributes.get("otel_gpu.response.chunks") for rid, st in streams.items() if st]
    assert all(c and c >= 3 for c in chunks)  # at least 2 tokens and [DONE]
    # Queueing: until the first step a request was in, where that step was decided before
    # its span went out (38 of 65 streams in one run: a short stream ends before its first
    # step is decided, STEP_LAG_NS after the next one). Never past the request.
    queued = {rid: s.attributes["otel_gpu.time.queued"] for rid, s in servers.items()
              if "otel_gpu.time.queued" in s.attributes}
    print(f"queued known for {len(queued)} of {sum(streams.values())} streams")
    assert len(queued) >= 5, queued
    wrong = []
    for rid, q in queued.items():
        s = servers[rid]
        assert 0 <= q <= (s.end_ns - s.start_ns) / 1e9, (rid, q)
        first = min(k for k, members in steps.items() if rid in members)  # as the engine logged it
        if abs(q - max(0, by_step[first].start_ns - s.start_ns) / 1e9) > 1e-6:
            wrong.append((rid, q, first))
    assert len(wrong) <= 0.02 * len(queued) + 1, wrong  # a member unlinked from its first step (above)

    report = json.loads(subprocess.run([sys.executable, "-m", "otel_gpu.cli", "report", "--db", db, "--format", "json"],
                                       capture_output=True, text=True, check=True, cwd=ROOT).stdout)
    per = {c["feature"]: c for c in report["per_chunk"]}
    stream = per["/stream/{id}"]
    assert stream["chunks"] == sum(chunks) and stream["gpu_seconds_per_chunk"] > 0
    split = sum(r["split_gpu_seconds"] for r in report["rows"] if r["feature"] == "/stream/{id}")
    assert stream["gpu_seconds"] == pytest.approx(split)  # the front-end's requests made no calls themselves
    print(f"report: /stream/{{id}} {stream['chunks']} chunks, {stream['gpu_seconds_per_chunk'] * 1e3:.3f} GPU ms "
          f"and {stream['cost_per_chunk']:.2e} USD per chunk")
