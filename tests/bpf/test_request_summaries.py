"""Every request keeps its summary when the ring buffer cannot take its records (issue
26, item 2). The collector is stopped (SIGSTOP) with a 16 KiB ring buffer while
keep-alive clients and one-shot clients send requests: nearly all their records are
lost. The kernel delimits HTTP/1 requests itself (a read after a write starts the
next), summarises each request that lost a record (count and duration), and the
request metric counts every request served. No span is wrong: a request whose
records were lost has none, and the same connections are followed exactly again
once records fit (each request's launch count encodes it)."""
from __future__ import annotations

import http.client
import os
import signal
import threading
import time
import urllib.request
from urllib.parse import parse_qs

from otel_gpu.demo.runner import free_port
from tests.bpf.targets.relia_support import stopped_counters
from tests.bpf.test_metrics import _scrape, _value
from tests.bpf.test_reliability_backend import _target
from tests.harness import server_spans

CLIENTS = 4
STOPPED = 20   # requests per keep-alive client while the collector is stopped
AFTER = 6     # on the same connections once it runs again
ONE_SHOT = 8  # requests on connections of their own while it is stopped


def _launches(i: int) -> int:
    return 1 + i % 5


class KeepAliveClient:
    """One connection for its whole life; `send` makes requests on it in turn."""

    def __init__(self, port: int, who: int) -> None:
        self.conn = http.client.HTTPConnection("127.0.0.1", port, timeout=20)
        self.who, self.sent = who, 0

    def send(self, n: int) -> None:
        for _ in range(n):
            i = self.who * 1000 + self.sent
            self.conn.request("GET", f"/work?launches={_launches(i)}&n={i}")
            resp = self.conn.getresponse()
            assert resp.status == 200 and resp.read() == b"ok"
            self.sent += 1


def _in_threads(fns) -> None:
    threads = [threading.Thread(target=f) for f in fns]
    for t in threads:
        t.start()
    for t in threads:
        t.join(60)
    assert not any(t.is_alive() for t in threads), "a client is stuck"


def test_requests_whose_records_are_lost_are_summarised_in_the_kernel(receiver, start_collector, targets):
    prom = free_port()
    collector = start_collector("--exe", "relia_sum", "--ringbuf-pages", "4", "--prometheus-port", str(prom),
                                "--export-query")
    target = _target(collector, "relia_sum", targets)
    clients = [KeepAliveClient(target.port, who) for who in range(1, CLIENTS + 1)]
    _in_threads([lambda c=c: c.send(1) for c in clients])  # connections known before the loss

    os.kill(collector.proc.pid, signal.SIGSTOP)
    try:
        one_shot = [lambda j=j: urllib.request.urlopen(
            f"http://127.0.0.1:{target.port}/work?launches={_launches(j)}&n={j}", timeout=20).read()
            for j in range(ONE_SHOT)]
        _in_threads([lambda c=c: c.send(STOPPED) for c in clients] + one_shot)
    finally:
        os.kill(collector.proc.pid, signal.SIGCONT)
    time.sleep(1)  # the ring drained: what follows, one request at a time, fits
    for _ in range(AFTER):  # the first round: each connection tells of its losses before the next calls
        for c in clients:
            c.send(1)
    served = CLIENTS * (1 + STOPPED + AFTER) + ONE_SHOT

    def counts(text):  # (/work requests with their route, requests summarised): the latter are all /work
        return (_value(text, "http_server_request_duration_seconds_count", http_route="/work"),
                _value(text, "http_server_request_duration_seconds_count", otel_gpu_request_summarised="true"))

    deadline, text = time.monotonic() + 30, ""
    while time.monotonic() < deadline:
        text = _scrape(prom)
        if sum(counts(text)) >= served:
            break
        time.sleep(0.5)
    routed, summarised = counts(text)
    counted = routed + summarised
    assert collector.stop() == 0
    counters = stopped_counters(collector)
    print(f"{served} requests served; counted {counted:.0f}, {summarised:.0f} of them summarised in the kernel; "
          f"{counters}")
    assert counted == served, counters
    assert counters.get("requests_summarised") == summarised  # the stopped line counts them too
    assert summarised >= CLIENTS * STOPPED // 2, counters  # the ring held a few records at most
    assert counters.get("lost_events", 0) > 0

    spans = {int(parse_qs(s.attributes["url.query"])["n"][0]): s
             for s in server_spans(receiver.spans, target.pid) if s.attributes["url.path"] == "/work"}
    for i, s in spans.items():  # a span holds its own calls and no other's (ambiguous ones are linked)
        assert s.attributes["gpu.launches"] <= _launches(i), (i, s.attributes)
    # Once every connection has told of its losses, each request has its span and all its calls.
    resumed = {c.who * 1000 + k for c in clients for k in range(2 + STOPPED, 1 + STOPPED + AFTER)}
    assert resumed <= spans.keys(), f"{len(resumed - spans.keys())} requests on the resumed connections have no span"
    assert [i for i in resumed if spans[i].attributes["gpu.launches"] != _launches(i)] == []
    assert len(spans) == routed
