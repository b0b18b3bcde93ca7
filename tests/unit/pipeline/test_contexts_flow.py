"""Python-context attribution over whole uvicorn-shaped flows (pipeline/contexts.py
through the stitcher): many requests' records interleaved at random, each request's
calls on its task, a worker thread's copy of it, or between the chunks of a streamed
response, with background work beside them. Every call encodes its request in its kernel
pointer, so the owner of every child is checked. The cases one by one: test_contexts.py."""
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from tests.unit.pipeline.test_contexts import (BACKGROUND, BASE, BG_UNTRACKED, CHUNKED, Events, funcs, new,
                                               requests, task, windows, worker_ctx)


def uvicorn_request(e, fd, launches, worker=None, streaming=False):
    """The records of one request, in its own order (timestamps assigned when drawn):
    the loop reads the head, creates the request's task; the task (or a copy of it run
    by worker thread `worker`) makes calls; the task writes the response."""
    t = task(fd)
    steps = [lambda: e.read(fd), lambda: e.copy(t, BASE)]
    if worker is not None:
        w = worker_ctx(fd)
        steps.append(lambda: e.copy(w, t))
        steps += [lambda: e.call(w, fd, tid=worker)] * launches
        steps.append(lambda: e.write(fd, t))
    elif streaming:
        half = launches // 2
        steps += [lambda: e.call(t, fd)] * half
        steps.append(lambda: e.write(fd, t, CHUNKED))
        for _ in range(launches - half):
            steps.append(lambda: e.call(t, fd))
            steps.append(lambda: e.write(fd, t, b"5\r\nhello\r\n"))
        steps.append(lambda: e.write(fd, t, b"0\r\n\r\n"))
    else:
        steps += [lambda: e.call(t, fd)] * launches
        steps.append(lambda: e.write(fd, t))
    return steps


def interleave(rng, sequences):
    """A random merge that keeps each sequence's own order."""
    seqs = [list(s) for s in sequences]
    out = []
    while any(seqs):
        s = rng.choice([s for s in seqs if s])
        out.append(s.pop(0)())
    return out


def run_flow(n, seed, worker=False, streaming=False, background=False):
    rng = random.Random(seed)
    e = Events()
    s = new()
    fds = list(range(20, 20 + n))
    launches = {fd: rng.randint(1, 6) for fd in fds}
    out = s.process([e.copy(0xBB, BASE)] if background else [])  # a background task, before any request
    out += s.process([e.accept(fd) for fd in fds])
    seqs = [uvicorn_request(e, fd, launches[fd], worker=(2 + fd % 3) if worker else None,
                            streaming=streaming and fd % 2 == 0) for fd in fds]
    if background:
        seqs.append([lambda: e.call(0xBB, BACKGROUND)] * 5 + [lambda: e.call(BG_UNTRACKED, BACKGROUND)] * 5)
    records = interleave(rng, seqs)
    for i in range(0, len(records), 7):  # batches of any size
        out += s.process(records[i:i + 7])
    out += s.process([e.tick()])
    return s, out, launches


@pytest.mark.parametrize("n", [1, 2, 8, 32])
@pytest.mark.parametrize("seed", range(4))
@pytest.mark.parametrize("shape", ["task", "worker", "streaming"])
def test_uvicorn_flow_every_call_lands_on_its_own_request(n, seed, shape):
    s, out, launches = run_flow(n, seed, worker=shape == "worker", streaming=shape == "streaming")
    reqs = requests(out)
    assert sorted(reqs) == sorted(launches)
    for fd, r in reqs.items():
        assert r.error is None and r.status == 200
        assert funcs(r.sink) == [fd] * launches[fd]          # its own calls, nobody else's
        assert set(r.sink.attributed) == {"task"}
        assert r.sink.summary.ambiguous == 0
        assert r.context == task(fd)
        assert r.busy.start_ns <= r.busy.end_ns and not r.busy.empty
    assert windows(out) == {}
    assert s.attributed["task"] == sum(launches.values())
    assert s.attributed["ambiguous"] == s.attributed["thread"] == s.attributed["process"] == 0
    assert s.state()["pending_calls"] == 0


@settings(max_examples=60, deadline=None)
@given(n=st.integers(1, 12), seed=st.integers(0, 2**32 - 1), worker=st.booleans(),
       streaming=st.booleans())
def test_random_interleavings_with_background_work_never_charge_a_wrong_request(n, seed, worker, streaming):
    s, out, launches = run_flow(n, seed, worker=worker, streaming=streaming, background=True)
    reqs = requests(out)
    for fd, r in reqs.items():
        assert funcs(r.sink) == [fd] * launches[fd]
        assert set(r.sink.attributed) == {"task"}
    ws = windows(out)
    # The tracked background task: outside once every candidate bound its own task.
    # The untracked one: outside, or ambiguous while some request was not bound yet.
    assert funcs(ws["outside"].sink).count(BACKGROUND) + (
        funcs(ws["ambiguous"].sink).count(BACKGROUND) if "ambiguous" in ws else 0) == 10
    if "ambiguous" in ws:
        assert set(ws["ambiguous"].sink.attributed) == {"ambiguous"}
    tracked_outside = [c for c, _ in ws["outside"].sink.calls if c.ctx == 0xBB]
    assert len(tracked_outside) == 5
    assert s.attributed["task"] == sum(launches.values())
    assert s.attributed["outside"] + s.attributed["ambiguous"] == 10
    assert s.attributed["thread"] == s.attributed["process"] == 0
    assert s.state()["pending_calls"] == 0
