"""`shared`: GPU work of a process with no request of its own while related processes
(one group: pipeline/groups.py) have requests open; one window per batch step, cut at
synchronising calls, linked to the requests in flight, never parented under one."""
import random

from otel_gpu.pipeline.model import ProcessWindow, Request
from otel_gpu.records import KernelRollup, ProcExit, SyncCall, Tick
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline.facts import WithFacts
from otel_gpu.cuda_calls import call_id
from tests.unit.pipeline.test_stitcher import OK, T, accept, cuda, get, read, write

FRONT, WORKER, STRANGER = 100, 200, 300
GROUPS = {FRONT: "cgroup:/pod/a", WORKER: "cgroup:/pod/a", STRANGER: "cgroup:/pod/b"}


def new():
    return WithFacts(Stitcher(span_budget=256, rng=random.Random(3)), group_of=GROUPS.get)


def ids(r: Request):
    return r.trace_id, r.span_id


def windows(out, attribution="shared"):
    return [w for w in out if isinstance(w, ProcessWindow) and w.attribution == attribution]


def step(n, pid=WORKER, grid=0):
    """A batch step: n launches then a device synchronize."""
    return [cuda(pid=pid, func=0x1000 + grid) for _ in range(n)] + [cuda("cudaDeviceSynchronize", pid=pid)]


def open_requests(s, fds):
    out = s.process([accept(fd=fd, pid=FRONT) for fd in fds]
                    + [read(get(f"/gen/{fd}"), fd=fd, tid=fd, pid=FRONT) for fd in fds])
    return {r.fd: r for r in (o.request for o in out if hasattr(o, "request"))}


def test_batch_steps_are_shared_windows_cut_at_syncs_linked_to_the_requests_in_flight():
    s = new()
    reqs = open_requests(s, [10, 11, 12])
    out = s.process(step(3))
    assert windows(out) == []  # a step waits for its requests' writes (pipeline/steps.py)

    # 10 is answered after step 1; 13 arrives in the middle of step 2.
    out = s.process([write(OK, fd=10, tid=10, pid=FRONT)] + step(2)[:1])
    done = [r for r in out if isinstance(r, Request)]
    assert done == [reqs[10]] and done[0].sink.calls == [] and done[0].sink.summary.calls == 0
    reqs.update(open_requests(s, [13]))
    s.process(step(2)[1:])

    # Everything answered after step 2: the worker's next calls are its own business, outside.
    out = s.process([write(OK, fd=fd, tid=fd, pid=FRONT) for fd in (11, 12, 13)])
    assert all(r.sink.summary.calls == 0 and r.sink.summary.ambiguous == 0 for r in out if isinstance(r, Request))
    assert windows(s.process(step(1))) == []
    out = s.process([Tick(T() + 10**9)])
    w1, w2 = windows(out)
    # Step 1: 10 answered after it (a member); 11 and 12 had written nothing yet (linked by overlap).
    assert w1.tgid == WORKER and w1.candidates == [ids(reqs[fd]) for fd in (10, 11, 12)]
    assert w1.link_rules == {ids(reqs[10]): "batch_member", ids(reqs[11]): "overlap", ids(reqs[12]): "overlap"}
    assert w1.sink.summary.launches == 3 and w1.sink.attributed == {"shared": 4}
    assert type(w1.sink.calls[-1][0]) is SyncCall and w1.end_ns >= w1.sink.calls[-1][0].ts_ns
    # Step 2: 10 had finished; the other three answered after it.
    assert w2.candidates == [ids(reqs[fd]) for fd in (11, 12, 13)]
    assert set(w2.link_rules.values()) == {"batch_member"} and w2.sink.summary.launches == 2
    (outside,) = windows(out, "outside")
    assert outside.tgid == WORKER and outside.candidates == [] and outside.sink.summary.calls == 2
    assert s.attributed["shared"] == 4 + 3 and s.attributed["outside"] == 2
    assert s.attributed["thread"] == s.attributed["process"] == s.attributed["ambiguous"] == 0


def test_a_process_in_another_group_stays_outside_and_its_sync_cuts_nothing():
    s = new()
    open_requests(s, [10])
    out = s.process(step(2, pid=STRANGER) + step(1, pid=WORKER)[:1])
    assert windows(out) == []
    out = s.process([Tick(0)])
    assert [w.tgid for w in windows(out, "outside")] == [STRANGER]
    (w,) = windows(out)  # the worker's unfinished step goes at the Tick
    assert w.tgid == WORKER and w.sink.summary.launches == 1


def test_without_groups_nothing_is_shared():
    s = Stitcher(span_budget=256, rng=random.Random(3))
    open_requests(s, [10])
    out = s.process(step(2) + [Tick(0)])
    assert windows(out) == [] and windows(out, "outside")[0].sink.summary.calls == 3


def test_the_process_own_requests_keep_their_attribution():
    """A process with requests of its own never gets shared, even while related ones
    have requests open: its calls go by its own rules."""
    s = new()
    reqs = open_requests(s, [10])
    s.process([accept(fd=20, pid=WORKER), read(get("/own"), fd=20, tid=5, pid=WORKER)])
    out = s.process([cuda(pid=WORKER, tid=5), write(OK, fd=20, tid=5, pid=WORKER)])
    (own,) = [r for r in out if isinstance(r, Request)]
    assert own.sink.attributed == {"thread": 1} and reqs[10].sink.summary.calls == 0
    assert windows(s.process([Tick(0)])) == []


def test_kernel_counted_calls_are_shared_per_tick_while_group_requests_are_open():
    s = new()
    reqs = open_requests(s, [10, 11])
    launch, t0 = call_id("cudaLaunchKernel"), T()  # read between t0 + 1 ms and t0 + 5 ms
    out = s.process([KernelRollup(WORKER, launch, 0x1000, 40, 0, 0, t0 + 5_000_000, t0 + 1_000_000),
                     KernelRollup(STRANGER, launch, 0x1000, 7, 0, 0, t0 + 5_000_000, t0 + 1_000_000),
                     Tick(t0 + 6_000_000)])
    (w,) = windows(out)
    assert w.tgid == WORKER and w.sink.summary.launches == 40 and w.candidates == [ids(reqs[10]), ids(reqs[11])]
    assert [x.tgid for x in windows(out, "outside")] == [STRANGER]
    assert s.attributed["shared"] == 40 and s.attributed["outside"] == 7


def test_a_worker_exiting_mid_step_hands_its_window_on():
    s = new()
    open_requests(s, [10])
    out = s.process(step(2)[:2] + [ProcExit(WORKER, 0)])
    (w,) = windows(out)
    assert w.sink.summary.launches == 2 and not any(isinstance(r, Request) for r in out)


def test_a_related_request_begun_after_a_worker_call_is_not_its_batch():
    """The front-end's head came out of the ring buffer before the worker's call, made
    earlier on another CPU: no request of the group was open at the call, so it is
    outside, not a batch step of that request."""
    s = new()
    early = cuda(pid=WORKER)  # stamped before the head below, read after it
    s.process([accept(fd=10, pid=FRONT), read(get("/gen/10"), fd=10, tid=10, pid=FRONT), early])
    assert s.attributed["outside"] == 1 and s.attributed["shared"] == 0
    s.process([cuda(pid=WORKER)])  # made while the request is open: its batch
    assert s.attributed["shared"] == 1
