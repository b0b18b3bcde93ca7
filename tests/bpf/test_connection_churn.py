"""A new connection for every request, one client after the other, on a threaded server: a
handler thread closes its connection just as the accepting thread takes the client's next
one, which gets the number just freed. The kernel sees a close at its syscall's exit, so that accept
may come before it, after it, or beside it on another CPU (bpf/http_syscalls.c): whatever
the order, every request keeps its own exact span (before the fix, 2-6 of ~1,000 had none,
and some runs put every later call outside any request). Request i makes 1 + i % 3 launches
and names itself in its query.

Real probes, the real libcudart wheel, the real stdlib threaded server."""
from __future__ import annotations

from tests.harness import children_of, server_spans

REQUESTS = 1500


def _launches(i: int) -> int:
    return 1 + i % 3


def test_every_request_on_a_new_connection_keeps_its_exact_span(receiver, start_collector, start_target):
    collector = start_collector("--export-query")
    target = start_target()
    collector.wait_traced(target.pid)
    target.go()
    for i in range(REQUESTS):  # urllib: one connection a request, closed by the server
        target.get(f"/work?launches={_launches(i)}&n={i}")

    def numbered(spans) -> dict:
        return {int(s.attributes["url.query"].split("n=")[1]): s for s in server_spans(spans, target.pid)
                if s.attributes.get("url.path") == "/work"}
    receiver.wait_for(lambda spans: len(numbered(spans)) >= REQUESTS, 30)
    got = numbered(receiver.spans)
    assert collector.stop() == 0
    missing = sorted(set(range(REQUESTS)) - set(got))
    assert not missing, f"{len(missing)} requests without a span: {missing[:20]}"
    for i, span in got.items():  # its own launches, as its children: none outside, none another's
        kids = [k for k in children_of(receiver.spans, span) if k.name.startswith("cudaLaunchKernel")]
        assert (span.attributes["gpu.launches"], len(kids)) == (_launches(i), _launches(i)), i
