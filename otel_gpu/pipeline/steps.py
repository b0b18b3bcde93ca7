"""Which requests took part in a batch step (a shared window cut at its process's
synchronising call), from what their connections did: a streaming request writes a
response chunk after each step it is in (the front-end relays each step's tokens), and a
request waiting in the engine's queue, or done in the engine and still closing, writes
nothing. So a step's window, ending at t_k, is linked to:
  - BATCH_MEMBER: a candidate that wrote part of its answer after t_k and no later than
    the end of the process's next step (or, for the last step, than the records read): a
    body chunk, or the head of a response of declared length (its body may follow in
    another write);
  - OVERLAP: a candidate with no response written yet (a request that answers in one
    write at its end, until it does): today's rule, linked by being open, and said so;
  - nobody else: a candidate whose response headers were out and that wrote nothing in
    that interval was not in the step, and neither was one that began after the step's
    last call ended or ended before its first call (its record was read on the wrong
    side of the step's calls: records of other CPUs come out of order, by microseconds,
    and by milliseconds on a starved host).
Candidates are the requests open while the step's calls were read (in related
processes: pipeline/groups.py; or in the process, for a goroutine batcher). The window's
cost is split among its links only (pipeline/cost.py), so a queued request pays nothing
for steps it was not in; and a streamed request's wait before the first step it was a member
of is its queueing time (Request.queued_ns: otel_gpu.time.queued, where known when its span
goes; a response of declared length proves only its last step).

Assumes the front-end relays a step's tokens before the next step ends (true when a
step takes longer than the relay: milliseconds against tens of microseconds on one
host). Where it does not, a request's chunks land one step late. Steps are decided once
their interval has passed by STEP_LAG_NS (records of other CPUs may come that late), at
the latest at each Tick."""
from __future__ import annotations

from bisect import bisect_right

from .model import ProcessWindow

BATCH_MEMBER, OVERLAP = "batch_member", "overlap"  # how a request was linked to a step
STEP_LAG_NS = 20_000_000


class BatchSteps:
    def __init__(self) -> None:
        self.pending: dict[int, list[ProcessWindow]] = {}  # tgid -> its undecided steps, in order

    def ended(self, w: ProcessWindow, out: list) -> None:
        """A step's window, cut at its process's synchronising call."""
        if not w.linked:
            out.append(w)
            return
        self.pending.setdefault(w.tgid, []).append(w)
        self._decide(w.tgid, w.end_ns, out, final=False)

    def tick(self, now_ns: int, out: list, final: bool = False) -> None:
        for tgid in list(self.pending):
            self._decide(tgid, now_ns, out, final)

    def gone(self, tgid: int, now_ns: int, out: list) -> None:
        if tgid in self.pending:
            self._decide(tgid, now_ns, out, final=True)

    @staticmethod
    def unstepped(w: ProcessWindow) -> None:
        """A shared window with no step to read evidence by (cut by a flush, not by a
        synchronise; the kernel's counts): linked by overlap, said so."""
        w.link_rules = {ids: OVERLAP for ids, r in w.linked.items() if _overlaps(r, w)}
        w.candidates, w.candidate_ids = list(w.link_rules), set(w.link_rules)
        w.linked = {}

    def _decide(self, tgid: int, now_ns: int, out: list, final: bool) -> None:
        steps = self.pending[tgid]
        while steps:
            w = steps[0]
            if len(steps) > 1:
                until = steps[1].end_ns
            else:
                until = max(now_ns, w.end_ns) if final else now_ns - STEP_LAG_NS
            if not final and (until > now_ns - STEP_LAG_NS or until <= w.end_ns):
                break
            steps.pop(0)
            _link_members(w, until)
            out.append(w)
        if not steps:
            del self.pending[tgid]

    def state(self) -> dict:
        return {"batch_steps_pending": sum(len(s) for s in self.pending.values())}


def _overlaps(r, w: ProcessWindow) -> bool:
    """The request was open, by its timestamps, at some time in the window."""
    return r.start_ns <= w.end_ns and not (r.end_ns and r.end_ns < w.start_ns)


def _link_members(w: ProcessWindow, until: int) -> None:
    rules = {}
    for ids, r in w.linked.items():
        if not _overlaps(r, w):
            continue
        i = bisect_right(r.chunk_ts, w.end_ns)
        if i < len(r.chunk_ts) and r.chunk_ts[i] <= until:
            rules[ids] = BATCH_MEMBER
            # A streamed response writes after every step it is in, so its first member step
            # is its first step (steps come in order); a response of declared length writes
            # once, after its last step, which says nothing of its first.
            if r.streamed:
                queued = max(0, w.start_ns - r.start_ns)
                if r.queued_ns is None or queued < r.queued_ns:
                    r.queued_ns = queued
        elif not r.headers_ts or r.headers_ts > until:
            rules[ids] = OVERLAP
    w.candidates, w.candidate_ids = list(rules), set(rules)
    w.link_rules = rules
    w.linked = {}
