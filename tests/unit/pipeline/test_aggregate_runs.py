"""A thread's kernel counts between two records arrive as one AggregateRun
(kernel_io/reader.py runs) and are decided once where their facts are the same
(pipeline/attribution.py on_run). Held to the same outcome as each count decided alone,
over random streams: threads serving their own connections, a thread touching another's
(its proof fails), a helper thread with no connection, counts made before a head that
another CPU's record put ahead of them, and a hold cap that the runs cross."""
from __future__ import annotations

import random

import pytest

from otel_gpu.cuda_calls import call_id
from otel_gpu.kernel_io.reader import runs
from otel_gpu.pipeline.model import ProcessWindow, Request
from otel_gpu.pipeline.stitcher import Stitcher
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, Accept, AggregateRun, CallAggregate, SockIo, Tick

PID = 4242
LAUNCH, MEMCPY = call_id("cudaLaunchKernel"), call_id("cudaMemcpy")
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
THREADS = (1, 2, 3)  # each serves its own connection (fd 10 + tid)
HELPER = 9           # reads no connection: process.one / process.several


def _stream(rng: random.Random) -> list:
    """Records of one process as the reader hands them: socket records with their epochs,
    and between them runs of counts by (call, detail)."""
    out: list = [Accept(PID, t, 1, 10 + t, 3, "10.0.0.1", 5000 + t) for t in THREADS]
    ts, epoch, n, open_ = 10, 0, 0, set()
    for _ in range(rng.randrange(20, 60)):
        ts += 100
        t = rng.choice(THREADS)
        fd = 10 + t if rng.random() < 0.9 else 10 + rng.choice(THREADS)  # now and then another's: mixed
        epoch += 1
        if fd not in open_ and fd == 10 + t:
            n += 1
            head = f"GET /r?n={n} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
            out.append(SockIo(EV_SOCK_READ, PID, t, ts, fd, len(head), head, b"", epoch=epoch, req_start=True))
            open_.add(fd)
        elif fd in open_:
            out.append(SockIo(EV_SOCK_WRITE, PID, t, ts, fd, len(OK), OK, OK[-8:], epoch=epoch))
            open_.discard(fd)
        else:
            continue
        for _ in range(rng.randrange(0, 4)):  # counts of the epoch that record began
            tid = rng.choice(THREADS + (HELPER,))
            aggs = []
            for k in range(rng.randrange(1, 8)):
                early = rng.random() < 0.15  # made before the last head: another CPU's record came first
                first = ts - 150 + k if early else ts + 5 + k
                call, detail = (MEMCPY, rng.choice((1, 2))) if rng.random() < 0.2 else (LAUNCH, 0x1000 + 16 * k)
                count = rng.randrange(1, 50)
                aggs.append(CallAggregate(PID, tid, epoch, call, detail, 0, count, 64 * count if call == MEMCPY else 0,
                                          0, first, first + 20, first + 30))
            out.append(("counts", aggs))
    out.append(Tick(ts + 10_000, final=True))
    return out


def _as(stream: list, whole: bool) -> list:
    """The stream with each thread's counts as the reader places them (`whole`), or each
    count as a run of its own (decided alone, as before runs)."""
    out = []
    for r in stream:
        if type(r) is tuple:
            out += runs(r[1]) if whole else [AggregateRun(a.tgid, a.tid, a.epoch, a.ctx, a.http_unseen, [a])
                                             for a in sorted(r[1], key=lambda a: a.ts_ns)]
        else:
            out.append(r)
    return out


def _outcome(s: Stitcher, records: list) -> dict:
    """What the stitcher concluded: per request (named by its query) and per window, the
    calls by (call, detail) and attribution, the ambiguous shares; the counts by rule."""
    reqs, windows = {}, []
    for r in records:
        if isinstance(r, Request):
            sink = r.sink
            reqs[r.head.path] = ({k: (a.count, a.bytes) for k, a in sink.rollups.items()}, sink.attributed,
                                 pytest.approx(sink.summary.ambiguous))
        elif isinstance(r, ProcessWindow):
            windows.append((r.attribution, {k: a.count for k, a in r.sink.rollups.items()}))
    return {"requests": reqs, "windows": sorted(windows, key=repr), "rules": dict(s.by_rule),
            "held": s.procs[PID].holds.held if PID in s.procs else 0}


@pytest.mark.parametrize("cap", [None, 12])
def test_a_run_is_decided_as_its_counts_one_by_one(cap):
    """`cap`: the process's hold cap, small enough that runs cross it (process.held_full)."""
    for seed in range(150):
        stream = _stream(random.Random(seed))
        got = []
        for whole in (True, False):
            s = Stitcher(span_budget=8, rng=random.Random(1))
            records = _as(stream, whole)
            s.process(records[:len(THREADS)])  # the accepts: the process exists
            if cap is not None:
                s.procs[PID].holds.max_held = cap
            got.append(_outcome(s, s.process(records[len(THREADS):])))
        assert got[0] == got[1], seed
        assert got[0]["requests"], seed  # requests finished: the comparison saw them


def test_runs_keep_every_count_once_one_key_each_in_time_order():
    rng = random.Random(3)
    aggs = [CallAggregate(PID, rng.choice((1, 2, 3)), rng.choice((5, 6)), LAUNCH, k, rng.choice((0, 0x70)), 1, 0, 0,
                          rng.randrange(1000), 0, 0) for k in range(200)]
    out = runs(aggs)
    assert sorted(id(a) for r in out for a in r.aggregates) == sorted(map(id, aggs))
    keys = [(r.tgid, r.tid, r.epoch, r.ctx, r.http_unseen) for r in out]
    assert len(set(keys)) == len(keys)
    for r in out:
        assert all((a.tgid, a.tid, a.epoch, a.ctx, a.http_unseen) == (r.tgid, r.tid, r.epoch, r.ctx, r.http_unseen)
                   for a in r.aggregates)
        assert [a.ts_ns for a in r.aggregates] == sorted(a.ts_ns for a in r.aggregates)
    firsts = [r.aggregates[0].ts_ns for r in out]
    assert firsts == sorted(firsts)


@pytest.mark.parametrize("whole", [True, False])
def test_a_held_graph_launch_count_keeps_the_kernels_it_ran(whole):
    """A thread's graph launches the kernel counted (named by pipeline/graphs.py) are held
    for its request's proof like any count, and settle with the kernels each launch ran."""
    graph = call_id("cudaGraphLaunch")
    head = b"GET /g HTTP/1.1\r\nHost: x\r\n\r\n"
    aggs = [CallAggregate(PID, 1, 1, graph, 0xE0, 0, 3, 0, 0, 120, 130, 140, kernels=((0xF00, 2), (0xF10, 1))),
            CallAggregate(PID, 1, 1, LAUNCH, 0x1000, 0, 5, 0, 0, 125, 135, 145)]
    records = [Accept(PID, 1, 1, 11, 3, "10.0.0.1", 5001),
               SockIo(EV_SOCK_READ, PID, 1, 100, 11, len(head), head, b"", epoch=1, req_start=True),
               *_as([("counts", aggs)], whole),
               SockIo(EV_SOCK_WRITE, PID, 1, 200, 11, len(OK), OK, OK[-8:], epoch=2), Tick(10_000, final=True)]
    s = Stitcher(span_budget=8, rng=random.Random(1))
    (req,) = [r for r in s.process(records) if isinstance(r, Request)]
    assert s.by_rule.get("thread.one") == 8  # held, then proven its thread's
    assert req.sink.rollups[(graph, 0xE0)].kernels == ((0xF00, 2), (0xF10, 1))
    assert req.sink.summary.graph_kernels == 3 * (2 + 1)
    assert req.sink.summary.kernels == {0x1000, 0xF00, 0xF10}
