"""When a process's runtime launch probes go and come back (probes/launch_routes.py),
driven by the kernel's per-process counts of paired and unpaired handles. The kernel's
side (every launch counted once whichever probes are attached) is tests/bpf/
test_launch_routes.py."""
from __future__ import annotations

from types import SimpleNamespace

from otel_gpu.cuda_calls import (DRIVER, RUNTIME, RUNTIME_CALLS, RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES,
                                  RUNTIME_LEARNERS)
from otel_gpu.probes.discovery import ProbeTarget
from otel_gpu.probes.launch_routes import STABLE_MAX_S, STABLE_S, UNREACHED_LAUNCHES, LaunchRoutes

CUDART = ProbeTarget(RUNTIME, "/lib/libcudart.so.12", (1, 10))
LIBCUDA = ProbeTarget(DRIVER, "/lib/libcuda.so.1", (1, 20))
OLD_CUDART = ProbeTarget(RUNTIME, "/wheel/libcudart.so.12", (1, 30))
PID = 4242


class FakeAttacher:
    def __init__(self):
        self.attached: dict = {}  # (key, pid) -> kind

    def attach(self, target, pid=None):
        if (target.key, pid) in self.attached:
            return 0
        self.attached[(target.key, pid)] = target.kind
        return 4

    def detach_target(self, key, pid):
        return 4 if self.attached.pop((key, pid), None) else 0

    def links_closed(self):
        return self.closing == 0

    closing = 0  # links still closing, as the closer's threads close them

    def kinds(self, pid):
        return sorted(kind for (_, p), kind in self.attached.items() if p == pid)


class Table(dict):
    """The kernel's launch_routes, keyed by pid (a c_uint32 from the reader)."""

    def get(self, key):
        return dict.get(self, key.value)

    def counts(self, pid, paired, unpaired=0, kept=0, graphs=0):
        self[pid] = SimpleNamespace(paired=paired, unpaired=unpaired, kept=kept, graphs=graphs)


def routes(now):
    attacher, table = FakeAttacher(), Table()
    return LaunchRoutes(attacher, table, clock=lambda: now[0]), attacher, table


def test_files_probed_before_a_driver_was_seen_keep_their_launch_probes_for_everyone():
    now = [0.0]
    r, attacher, _ = routes(now)
    assert r.calls_of(OLD_CUDART) == OLD_CUDART  # no driver seen yet: every row, every process
    r.saw([LIBCUDA, CUDART])
    assert r.calls_of(OLD_CUDART) == OLD_CUDART  # decided at its first sight, never changed
    assert r.calls_of(CUDART).kind == RUNTIME_CALLS
    assert r.calls_of(LIBCUDA) == LIBCUDA
    assert r.see(PID, [OLD_CUDART, LIBCUDA]) == 0 and not attacher.attached


def test_learned_then_detached_then_back_on_an_unpaired_handle():
    now = [100.0]
    r, attacher, table = routes(now)
    r.saw([LIBCUDA])
    assert r.see(PID, [CUDART, LIBCUDA]) == 12
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS]
    assert r.see(PID, [CUDART, LIBCUDA]) == 0  # the next scan: already there

    r.review()  # nothing paired yet: the launches may not reach the driver at all
    now[0] += 10 * STABLE_S
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS]

    table.counts(PID, paired=3)
    r.review()  # a new pair: the wait starts again
    now[0] += STABLE_S - 0.1
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS]
    now[0] += 0.1
    r.review()
    r.confirm_detached()  # the links closed (at once, here)
    assert attacher.kinds(PID) == [] and r.state() == {"at_driver": 1, "at_runtime": 0}
    assert r.see(PID, [CUDART, LIBCUDA]) == 0  # a scan does not bring them back

    table.counts(PID, paired=3, unpaired=1)  # a kernel first launched now
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_LAUNCHES, RUNTIME_LEARNERS]  # its graph launches stay at the driver
    table.counts(PID, paired=4, unpaired=1)
    r.review()
    now[0] += STABLE_S
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_LAUNCHES, RUNTIME_LEARNERS]  # the wait doubled
    now[0] += STABLE_S
    r.review()
    assert attacher.kinds(PID) == []
    assert r.processes[PID].stable_s == 2 * STABLE_S


def test_graph_launches_go_to_the_driver_once_seen_reaching_it_and_kernel_launches_stay(caplog):
    """A graph launch needs no pair: one seen reaching the driver's probe while learning
    sends the runtime's graph launch probes away at the next review (logged once their
    links have closed); the kernel launch probes and learners stay until pairs are made,
    and their return on an unpaired handle does not bring the graph probes back."""
    from otel_gpu.probes.launch_routes import graphs_at_driver_line
    caplog.set_level("INFO", "otel_gpu.probes.launch_routes")
    now = [0.0]
    r, attacher, table = routes(now)
    r.saw([LIBCUDA])
    r.see(PID, [CUDART, LIBCUDA])
    table.counts(PID, paired=0, kept=3)  # kernel launches that reach no driver probe yet
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS]
    table.counts(PID, paired=0, kept=3, graphs=1)
    attacher.closing = 1
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_LAUNCHES, RUNTIME_LEARNERS]
    r.confirm_detached()
    assert graphs_at_driver_line(PID) not in caplog.text  # its links still run
    attacher.closing = 0
    r.confirm_detached()
    assert caplog.text.count(graphs_at_driver_line(PID)) == 1
    assert r.state() == {"at_driver": 0, "at_runtime": 1}  # its kernel launches: at the runtime
    now[0] += 10 * STABLE_S
    r.review()  # no pair: the kernel launch probes stay however long
    assert attacher.kinds(PID) == [RUNTIME_LAUNCHES, RUNTIME_LEARNERS]
    table.counts(PID, paired=1, kept=4, graphs=3)
    r.review()
    now[0] += STABLE_S
    r.review()
    r.confirm_detached()
    assert attacher.kinds(PID) == [] and r.state() == {"at_driver": 1, "at_runtime": 0}
    table.counts(PID, paired=1, unpaired=1, kept=4, graphs=3)
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_LAUNCHES, RUNTIME_LEARNERS]


def test_at_the_driver_only_once_the_detached_links_have_closed(caplog):
    """A link's program runs until its close (probes/closer.py closes them in the
    background): the process is at the driver alone, and logged so, only after."""
    import logging

    from otel_gpu.probes.launch_routes import at_driver_line
    now = [0.0]
    r, attacher, table = routes(now)
    r.saw([LIBCUDA])
    r.see(PID, [CUDART, LIBCUDA])
    table.counts(PID, paired=1)
    r.review()
    now[0] += STABLE_S
    attacher.closing = 2
    with caplog.at_level(logging.INFO, logger="otel_gpu.probes.launch_routes"):
        r.review()
        r.confirm_detached()
        assert attacher.kinds(PID) == [] and r.state() == {"at_driver": 0, "at_runtime": 1}
        assert at_driver_line(PID) not in caplog.text
        attacher.closing = 0
        r.confirm_detached()
        assert r.state() == {"at_driver": 1, "at_runtime": 0}
        assert caplog.text.count(at_driver_line(PID)) == 1
        r.review()
        r.confirm_detached()
        assert caplog.text.count(at_driver_line(PID)) == 1


def test_the_wait_is_capped():
    now = [0.0]
    r, attacher, table = routes(now)
    r.saw([LIBCUDA])
    r.see(PID, [CUDART, LIBCUDA])
    for i in range(1, 12):
        table.counts(PID, paired=i, unpaired=i - 1)
        r.review()  # back (after the first), with a new pair
        now[0] += STABLE_MAX_S
        r.review()  # gone
        assert attacher.kinds(PID) == []
    assert r.processes[PID].stable_s == STABLE_MAX_S


def test_a_process_without_the_driver_keeps_its_runtime_probes_and_learns_nothing():
    now = [0.0]
    r, attacher, table = routes(now)
    r.saw([LIBCUDA])
    assert r.see(PID, [CUDART]) == 8
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES]
    table.counts(PID, paired=0, unpaired=5)
    now[0] += STABLE_MAX_S
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES]
    assert r.see(PID, [CUDART, LIBCUDA]) == 4  # it loaded the driver: its learners come
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS]


def test_runtime_launches_that_never_reach_the_driver_keep_the_runtime_probes_without_learners():
    """Where the runtime reaches the driver by an entry no probe is on (nothing pairs),
    learning would cost a learner run a launch for ever: after UNREACHED_LAUNCHES the
    learners go, the runtime probes stay, and no later scan brings the learners back."""
    now = [0.0]
    r, attacher, table = routes(now)
    r.saw([LIBCUDA])
    r.see(PID, [CUDART, LIBCUDA])
    table.counts(PID, paired=0, kept=UNREACHED_LAUNCHES - 1)
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES, RUNTIME_LEARNERS]
    table.counts(PID, paired=0, kept=UNREACHED_LAUNCHES)
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES]
    assert r.see(PID, [CUDART, LIBCUDA]) == 0 and attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES]
    now[0] += STABLE_MAX_S
    r.review()
    assert attacher.kinds(PID) == [RUNTIME_GRAPH_LAUNCHES, RUNTIME_LAUNCHES] and r.state() == {"at_driver": 0, "at_runtime": 1}


class PairCache:
    """The kernel's launch_pair_cache as the BatchMap user space reads it: slot -> a pair."""
    Leaf = staticmethod(lambda: SimpleNamespace(handle=0, func=0, tgid=0, check=0))

    def __init__(self, slots: dict):
        self.table = slots

    def items(self):
        return list(self.table.items())


def test_an_exited_process_leaves_no_entry_and_no_pair():
    """A pid given to a new process must not name its launches by the old one's pairs, in
    the pair table or in the cache in front of it (a slot may outlive its pair there)."""
    from collections import namedtuple
    Key = namedtuple("Key", "tgid handle")
    now = [0.0]
    r, attacher, table = routes(now)
    r.pairs = {Key(PID, 0xA0): 0x7000, Key(PID, 0xB0): 0x7100, Key(PID + 1, 0xA0): 0x7000}
    pair = SimpleNamespace(handle=0xC0, func=0x7200, tgid=PID, check=1)  # its LRU entry evicted
    other = SimpleNamespace(handle=0xA0, func=0x7000, tgid=PID + 1, check=2)
    r.cache = PairCache({3: pair, 9: other})
    r.saw([LIBCUDA])
    r.see(PID, [CUDART, LIBCUDA])
    table.counts(PID, paired=2)
    r.review()
    now[0] += STABLE_S
    r.review()
    r.confirm_detached()  # at the driver alone: no probe of its own left
    assert r.state() == {"at_driver": 1, "at_runtime": 0}
    r.exited({PID})
    assert r.state() == {"at_driver": 0, "at_runtime": 0}
    assert r.pairs == {Key(PID + 1, 0xA0): 0x7000}
    assert r.cache.table[3].tgid == 0 and r.cache.table[9] is other


def test_a_process_that_learned_then_left_loses_its_pairs_at_its_exit_and_one_that_never_learned_costs_no_read():
    """Pairs and slots are made only by a process whose learners were on: one that left
    (its probes detached, its entry forgotten) before it exited still loses them at its
    exit; the exit of one that never learned reads neither table."""
    from collections import namedtuple
    Key = namedtuple("Key", "tgid handle")

    class Untouchable(dict):
        def keys(self):
            raise AssertionError("read for a process that never learned")

        def items(self):
            raise AssertionError("read for a process that never learned")

    r, _, _ = routes([0.0])
    r.saw([LIBCUDA])
    r.see(PID, [CUDART, LIBCUDA])  # learns
    r.forget(PID)  # left: no longer selected, its probes detached
    r.pairs = Untouchable()
    r.cache = Untouchable()
    r.exited({PID + 7})  # never seen, never learned
    r.pairs = {Key(PID, 0xA0): 0x7000}
    r.cache = PairCache({5: SimpleNamespace(handle=0xA0, func=0x7000, tgid=PID, check=1)})
    r.exited({PID})
    assert r.pairs == {} and r.cache.table[5].tgid == 0
