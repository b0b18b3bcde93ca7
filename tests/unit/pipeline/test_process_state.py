"""pipeline/process_state.py: the indexes the rules read the open requests through
(Proc.open_at, Proc.open_on) stay equal to a scan of the open list, however requests open
and finish, out of time order included."""
import random
from types import SimpleNamespace

from otel_gpu.pipeline.process_state import Proc
from otel_gpu.pipeline.rule_facts import CallFacts, begun


class _Request:
    """As model.Request for these indexes: a tid, a start, compared by identity."""

    def __init__(self, tid: int, start_ns: int) -> None:
        self.tid, self.start_ns = tid, start_ns


def _holds(p: Proc, rng: random.Random) -> None:
    assert p.latest_start == max((r.start_ns for r in p.open), default=0)
    by_tid: dict = {}
    for r in p.open:
        by_tid.setdefault(r.tid, []).append(r)
    assert p.open_on == by_tid
    for ts in [0, p.latest_start, p.latest_start - 1, p.latest_start + 1] + [rng.randrange(1000) for _ in range(5)]:
        assert p.open_at(ts) == begun(p.open, ts)
        assert (p.open_at(ts) is p.open) == (begun(p.open, ts) is p.open)
        for tid in range(4):
            ev = SimpleNamespace(tid=tid)
            facts = CallFacts(p, ev, ts, p.open_at(ts), None, None, lambda _p: [])
            assert facts.on_thread == [r for r in begun(p.open, ts) if r.tid == tid]


def test_the_indexes_are_the_open_list_through_random_opens_and_finishes():
    rng = random.Random(17)
    p = Proc(1)
    for _ in range(400):
        if p.open and rng.random() < 0.45:
            assert p.closed(rng.choice(p.open))
        else:  # starts mostly later than the last, sometimes earlier (another CPU's record)
            p.opened(_Request(rng.randrange(4), max(1, p.latest_start + rng.randrange(-50, 100))))
        _holds(p, rng)
    assert not p.closed(_Request(0, 5))  # never opened: nothing changes
    _holds(p, rng)
