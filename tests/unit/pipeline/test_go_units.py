"""Goroutine attribution (pipeline/contexts.py through the stitcher), over synthetic
records shaped like a Go net/http server: each keep-alive connection has one goroutine
that reads its requests' heads and runs their handlers, on whichever OS thread the
scheduler gives it at each step (threads drawn at random per record); handlers fan out
to goroutines they start; a batcher goroutine fed by handlers; a background goroutine.
Every call encodes its request in its kernel pointer, so the owner of every child is
checked, and the rule is too: task through a binding or a lineage, shared through
hand-offs, outside for the rest."""
import random

import pytest

from otel_gpu.kernel_io.abi import GO_UNIT
from otel_gpu.pipeline.model import ProcessWindow, Request
from otel_gpu.records import EV_SOCK_READ, EV_SOCK_WRITE, Accept, ContextCopy, SockIo, Tick, UnitWake
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline import calls

PID = 700
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"
BATCHER, BACKGROUND = GO_UNIT | 2, GO_UNIT | 3
BG_WORK = 0xBBBB


def conn_g(fd):
    return GO_UNIT | (1000 + fd)


def child_g(fd, n, k):
    return GO_UNIT | (100_000 + fd * 100 + n * 10 + k)


def work(fd, n):
    return fd * 1000 + n  # the kernel pointer of request n on connection fd


class Go:
    def __init__(self, seed):
        self.rng = random.Random(seed)
        self.t = 1_000_000_000

    def ts(self):
        self.t += 1000
        return self.t

    def tid(self):
        return self.rng.randint(1, 4)  # GOMAXPROCS 4: any M runs any goroutine

    def accept(self, fd):
        return Accept(PID, self.tid(), self.ts(), fd, 3, "127.0.0.1", 40000 + fd)

    def read(self, fd, unit, n):
        raw = f"GET /r/{fd}/{n} HTTP/1.1\r\nHost: x\r\n\r\n".encode()
        return SockIo(EV_SOCK_READ, PID, self.tid(), self.ts(), fd, len(raw), raw, b"", unit)

    def write(self, fd, unit):
        return SockIo(EV_SOCK_WRITE, PID, self.tid(), self.ts(), fd, len(OK), OK, OK[-8:], unit)

    def spawn(self, child, parent):
        return ContextCopy(PID, self.tid(), self.ts(), child, parent)

    def wake(self, woken, waker):
        return UnitWake(PID, self.tid(), self.ts(), woken, waker)

    def call(self, unit, func, name="cudaLaunchKernel"):
        return calls.cuda(name, self.tid(), func, pid=PID, ts=self.ts(), ctx=unit)


def request(g, fd, n, mode):
    """One request on connection fd, its records in order (drawn lazily)."""
    me = conn_g(fd)
    steps = [lambda: g.read(fd, me, n)]
    if mode == "handler":
        steps += [lambda: g.call(me, work(fd, n))] * 3
    elif mode == "fanout":
        for k in range(3):
            steps += [lambda k=k: g.spawn(child_g(fd, n, k), me), lambda k=k: g.call(child_g(fd, n, k), work(fd, n))]
        steps += [lambda: g.wake(me, child_g(fd, n, 2))]  # wg.Done of the last one
    elif mode == "batch":
        steps += [lambda: g.wake(BATCHER, me), lambda: g.call(BATCHER, work(fd, n)), lambda: g.wake(me, BATCHER)]
    steps.append(lambda: g.write(fd, me))
    return steps


def run(seed, modes, conns=6, per_conn=3, background=True):
    g = Go(seed)
    s = Stitcher(span_budget=256, rng=random.Random(seed))
    fds = list(range(20, 20 + conns))
    out = s.process([g.accept(fd) for fd in fds])
    seqs = []
    for fd in fds:
        seq = []
        for n in range(per_conn):
            seq += request(g, fd, n, modes[(fd + n) % len(modes)])
        seqs.append(seq)
    if background:
        seqs.append([lambda: g.call(BACKGROUND, BG_WORK)] * 10)
    records = []
    while any(seqs):
        seq = g.rng.choice([q for q in seqs if q])
        records.append(seq.pop(0)())
    for i in range(0, len(records), 5):
        out += s.process(records[i:i + 5])
    out += s.process([Tick(g.ts(), True)])
    return s, out


def spans(out):
    reqs = {}
    for r in out:
        if isinstance(r, Request):
            fd, n = (int(x) for x in r.head.path.split("/")[2:4])
            reqs[work(fd, n)] = r
    return reqs


def windows(out, attribution):
    return [w for w in out if isinstance(w, ProcessWindow) and w.attribution == attribution]


@pytest.mark.parametrize("seed", range(12))
def test_handlers_and_their_goroutines_get_exactly_their_own_calls(seed):
    s, out = run(seed, ("handler", "fanout"))
    reqs = spans(out)
    assert len(reqs) == 18
    for key, r in reqs.items():
        assert [c.func for c, a in r.sink.calls] == [key] * 3, (key, r.sink.calls)
        assert {a for _, a in r.sink.calls} == {"task"}
    outside = [c.func for w in windows(out, "outside") for c, _ in w.sink.calls]
    assert outside == [BG_WORK] * 10  # the background goroutine: outside, open requests or not
    assert not windows(out, "ambiguous") and not windows(out, "shared")
    rules = {k: v for k, v in s.by_rule.items() if v}
    assert rules.get("unit.bound") == 18 * 3 and set(rules) <= {"unit.bound", "unit.unowned", "process.idle"}


@pytest.mark.parametrize("seed", range(8))
def test_a_batcher_fed_by_handlers_is_shared_with_the_open_requests(seed):
    s, out = run(seed, ("batch",), background=False)
    reqs = spans(out)
    assert all(not r.sink.calls for r in reqs.values())
    shared = windows(out, "shared")
    got = sorted(c.func for w in shared for c, a in w.sink.calls)
    assert got == sorted(reqs)
    assert {k: v for k, v in s.by_rule.items() if v} == {"unit.hand_off": len(reqs)}
    ids = {(r.trace_id, r.span_id): key for key, r in reqs.items()}
    for w in shared:
        linked = {ids[c] for c in w.candidates}
        assert {c.func for c, _ in w.sink.calls} <= linked  # each call's own request among its links


def test_a_goroutine_started_for_an_earlier_request_is_not_the_next_ones():
    """A fan-out goroutine of request 0 that calls after the connection's goroutine has
    read request 1: made before request 1 began, so not request 1's."""
    g = Go(1)
    s = Stitcher(span_budget=256, rng=random.Random(1))
    me, late = conn_g(20), child_g(20, 0, 0)
    out = s.process([g.accept(20), g.read(20, me, 0), g.spawn(late, me), g.write(20, me), g.read(20, me, 1),
                     g.call(late, 0xDEAD), g.call(me, work(20, 1)), g.write(20, me), Tick(g.ts(), True)])
    reqs = spans(out)
    assert [c.func for c, _ in reqs[work(20, 1)].sink.calls] == [work(20, 1)]
    assert not reqs[work(20, 0)].sink.calls
    assert [c.func for w in windows(out, "outside") for c, _ in w.sink.calls] == [0xDEAD]
