"""Several GPU processes at once (issue 13 item 2's second rate, bench item 12): concurrent
requests in 4 processes, each request well past --stream-budget, and the processes
together past the host-wide --stream-rate, so most calls are counted in the kernel per
request while others of the same and other processes stream. Every server span's
`gpu.launches` equals the launches its request made, and its children add up.
Not timed; bounded in count (4 x 2 x 3 requests, ~24k launches) and time."""
from __future__ import annotations

import threading

from tests.bpf.test_request_aggregates import _children_add_up
from tests.harness import server_spans

PROCS, CONNS, REQUESTS = 4, 2, 3
BUDGET, RATE = 16, 2000  # low, so the budget and the rate are both crossed
LAUNCHES = (700, 1300)   # per connection: different counts, so a mix-up shows


def _expected() -> list:
    return sorted(LAUNCHES[c % len(LAUNCHES)] + r for c in range(CONNS) for r in range(REQUESTS))


def test_concurrent_processes_each_request_exact(receiver, start_collector, start_target):
    targets = [start_target("stdlib") for _ in range(PROCS)]
    pid_args = [a for t in targets for a in ("--pid", str(t.pid))]  # other tests' CUDA processes stay out
    collector = start_collector("--stream-budget", str(BUDGET), "--stream-rate", str(RATE), *pid_args)
    for t in targets:
        collector.wait_traced(t.pid)
        t.go()
    start, errors = threading.Barrier(PROCS * CONNS, timeout=30), []

    def client(target, conn: int) -> None:
        try:
            start.wait()
            for r in range(REQUESTS):
                target.get(f"/work?launches={LAUNCHES[conn % len(LAUNCHES)] + r}")
        except Exception as e:  # noqa: BLE001 - reported below
            errors.append(e)
    threads = [threading.Thread(target=client, args=(t, c)) for t in targets for c in range(CONNS)]
    for th in threads:
        th.start()
    for th in threads:
        th.join(120)
    assert not errors and not any(th.is_alive() for th in threads), errors

    def work(spans, pid):
        return [s for s in server_spans(spans, pid) if s.attributes.get("http.route") == "/work"]
    n = CONNS * REQUESTS
    assert receiver.wait_for(lambda spans: all(len(work(spans, t.pid)) >= n for t in targets), timeout=90), \
        [len(work(receiver.spans, t.pid)) for t in targets]
    for t in targets:
        spans = work(receiver.spans, t.pid)
        assert sorted(s.attributes["gpu.launches"] for s in spans) == _expected(), t.pid
        for s in spans:
            assert s.attributes.get("otel_gpu.calls.ambiguous", 0) == 0
            _children_add_up(receiver, s, s.attributes["gpu.launches"])
