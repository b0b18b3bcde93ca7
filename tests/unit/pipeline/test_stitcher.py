"""Stitcher over synthetic event streams: requests, attribution, budgets, lifecycle."""
import random

import pytest

from otel_gpu.pipeline.model import ProcessWindow, Request
from otel_gpu.records import (EV_SOCK_READ, EV_SOCK_WRITE, Accept, KernelRollup, ProcessGone, ProcessSeen,
                              ProcExit, SockClose, SockIo, Tick)
from otel_gpu.pipeline.stitcher import Stitcher
from tests.unit.pipeline.facts import WithFacts
from otel_gpu.cuda_calls import call_id
from tests.unit.pipeline import calls

CALL_LAUNCH_KERNEL, CALL_MEMCPY, CALL_DEVICE_SYNC = (call_id("cudaLaunchKernel"), call_id("cudaMemcpy"),
                                                     call_id("cudaDeviceSynchronize"))

PID, FD = 4242, 10
OK = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok"


class Clock:
    def __init__(self):
        self.t = 1_000_000

    def __call__(self):
        self.t += 1000
        return self.t


T = Clock()


def accept(fd=FD, tid=1, pid=PID, inode=None):
    return Accept(pid, tid, T(), fd, 3, "10.0.0.9", 40000, inode=inode)


def read(raw: bytes, fd=FD, tid=1, pid=PID):
    return SockIo(EV_SOCK_READ, pid, tid, T(), fd, len(raw), raw[:1024], b"")


def write(raw: bytes, fd=FD, tid=1, pid=PID):
    return SockIo(EV_SOCK_WRITE, pid, tid, T(), fd, len(raw), raw[:1024], raw[-8:])


def get(path="/infer/1", extra=b""):
    return b"GET " + path.encode() + b" HTTP/1.1\r\nHost: x\r\n" + extra + b"\r\n"


def cuda(name="cudaLaunchKernel", tid=1, func=0x1000, nbytes=0, kind=0, pid=PID, duration=0):
    return calls.cuda(name, tid, func, nbytes, kind, pid, duration, ts=T())


def flush_windows(s):
    """The windows a Tick hands on."""
    out = s.process([Tick(T())])
    assert isinstance(out[-1], Tick)
    return out[:-1]


def rollups(s, rows, now_ns, since_ns=None):
    return s.process([KernelRollup(*row, now_ns, since_ns) for row in rows])


def requests(out):
    return [r for r in out if isinstance(r, Request)]


def new():
    return Stitcher(span_budget=256, rng=random.Random(7))


@pytest.mark.parametrize("n,k,m", [(1, 0, 0), (1, 3, 2), (4, 5, 3)])
def test_requests_with_calls_on_the_reading_thread(n, k, m):
    s = new()
    evs = [accept()]
    for i in range(n):
        evs.append(read(get(f"/infer/{i}")))
        evs += [cuda(func=0x1000 + j % 2) for j in range(k)]
        evs += [cuda("cudaMemcpy", nbytes=100, kind=1) for _ in range(m)]  # h2d
        evs += [cuda("cudaMemcpyAsync", nbytes=7, kind=2)]                # d2h
        evs.append(write(OK))
    out = s.process(evs)
    assert isinstance(out[0], ProcessSeen) and out[0].tgid == PID
    reqs = requests(out)
    assert [r.head.path for r in reqs] == [f"/infer/{i}" for i in range(n)]
    for r in reqs:
        assert r.status == 200 and r.error is None and r.end_ns >= r.start_ns
        assert (r.peer_addr, r.peer_port) == ("10.0.0.9", 40000)
        assert len(r.sink.calls) == k + m + 1
        assert {a for _, a in r.sink.calls} <= {"thread"}
        sm = r.sink.summary
        assert (sm.calls, sm.launches) == (k + m + 1, k)
        assert sm.memcpy_bytes.get("h2d", 0) == 100 * m and sm.memcpy_bytes["d2h"] == 7
        assert len(sm.kernels) == min(k, 2)
        assert sm.ambiguous == 0
    assert s.attributed["thread"] == n * (k + m + 1)
    assert len({r.trace_id for r in reqs}) == n  # each request its own trace


def test_call_on_another_thread_with_one_open_request_is_process():
    s = new()
    out = s.process([accept(), read(get()), cuda(tid=99), write(OK)])
    (r,) = requests(out)
    assert [(c.tid, a) for c, a in r.sink.calls] == [(99, "process")]
    assert s.attributed["process"] == 1


def test_a_request_begun_after_a_call_is_no_owner_of_it():
    """Records of two CPUs out of time order: a call on a worker thread is read after the
    head of a request that began later (another CPU's record came first). With one open
    request the call would be the process's (above); it was made before the request."""
    early = cuda(tid=99)  # stamped now, read after the head below
    s = new()
    out = s.process([accept(), read(get()), early, cuda(tid=98), write(OK)])
    (r,) = requests(out)
    assert [(c.tid, a) for c, a in r.sink.calls] == [(98, "process")]
    (w,) = flush_windows(s)
    assert w.attribution == "outside" and [c.tid for c, _ in w.sink.calls] == [99]
    # Two open requests, one begun after the call: it is no candidate of it.
    s.process([accept(fd=11), read(get("/a"), fd=11, tid=1)])
    early = cuda(tid=3)
    s.process([accept(fd=12), read(get("/b"), fd=12, tid=2), early])
    out = s.process([write(OK, fd=11, tid=1), write(OK, fd=12, tid=2)])
    a, b = requests(out)
    assert [(c.tid, att) for c, att in a.sink.calls] == [(3, "process")] and b.sink.calls == []


def ambiguous_setup():
    s = new()
    evs = [accept(fd=10), accept(fd=11),
           read(get("/a"), fd=10, tid=1), read(get("/b"), fd=11, tid=2),
           cuda(tid=3), cuda(tid=3, func=0x2000)]
    return s, s.process(evs)


def test_call_on_a_third_thread_with_two_open_requests_is_ambiguous():
    s, out = ambiguous_setup()
    assert requests(out) == []
    out = s.process([write(OK, fd=10, tid=1), write(OK, fd=11, tid=2)])
    a, b = requests(out)
    for r in (a, b):
        assert r.sink.calls == [] and r.sink.summary.calls == 0
        assert r.sink.summary.ambiguous == 1  # two calls, a half share each
    windows = flush_windows(s)
    (w,) = windows
    assert isinstance(w, ProcessWindow) and w.attribution == "ambiguous" and w.tgid == PID
    assert w.candidates == [(a.trace_id, a.span_id), (b.trace_id, b.span_id)]
    assert [att for _, att in w.sink.calls] == ["ambiguous", "ambiguous"]
    assert w.sink.summary.launches == 2
    assert flush_windows(s) == []  # handed on once
    assert s.attributed["ambiguous"] == 2


def test_calls_with_no_open_request_go_to_an_outside_window():
    s = new()
    s.process([accept(), read(get()), write(OK)])
    s.process([cuda(duration=500), cuda("cudaMemcpy", nbytes=64, kind=2)])
    (w,) = flush_windows(s)
    assert w.attribution == "outside" and w.candidates == []
    assert w.sink.summary.calls == 2 and w.sink.summary.memcpy_bytes == {"d2h": 64}
    assert w.end_ns >= w.start_ns


def test_span_budget_rolls_up_the_rest():
    s = Stitcher(span_budget=5, rng=random.Random(1))
    evs = [accept(), read(get())] + [cuda(func=0x1000 + i % 3) for i in range(12)] + [write(OK)]
    (r,) = requests(s.process(evs))
    assert len(r.sink.calls) == 5
    assert sum(a.count for a in r.sink.rollups.values()) == 7 == r.sink.rolled_up
    assert r.sink.summary.launches == 12 and len(r.sink.summary.kernels) == 3


def test_traceparent_header_joins_the_callers_trace():
    tp = b"traceparent: 00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01\r\n"
    s = new()
    (r,) = requests(s.process([accept(), read(get(extra=tp)), write(OK)]))
    assert r.trace_id == 0x4bf92f3577b34da6a3ce929d0e0e4736
    assert r.parent_span_id == 0x00f067aa0ba902b7 and r.parent_trace_id == r.trace_id
    assert r.span_id not in (0, r.parent_span_id)


def test_invalid_traceparent_starts_a_new_trace():
    s = new()
    (r,) = requests(s.process([accept(), read(get(extra=b"traceparent: junk\r\n")), write(OK)]))
    assert r.parent_span_id is None and r.trace_id != 0


def test_pipelined_request_opens_when_the_first_response_completes():
    s = new()
    out = s.process([accept(), read(get("/one") + get("/two"))])
    assert requests(out) == []
    w1 = write(OK)
    out = s.process([w1])
    assert [r.head.path for r in requests(out)] == ["/one"]
    # a call now belongs to the second request, which opened at w1
    c = cuda()
    w2 = write(OK)
    (second,) = requests(s.process([c, w2]))
    assert second.head.path == "/two" and second.start_ns == w1.ts_ns and second.end_ns == w2.ts_ns
    assert [x for x, _ in second.sink.calls] == [c]


def test_connection_closed_before_response_gives_an_error():
    s = new()
    out = s.process([accept(), read(get()), cuda(), SockClose(PID, 1, T(), FD)])
    (r,) = requests(out)
    assert r.error and "closed" in r.error and r.status is None
    assert len(r.sink.calls) == 1
    assert s.stats.snapshot()["requests_incomplete"] == 1


def test_a_close_read_after_the_accept_that_took_its_number_leaves_the_new_connection():
    """A close is seen at its syscall's exit, when another thread's accept may hold the fd
    number already and its record may come first (bpf/http_syscalls.c): the close names its
    socket's inode, and the new connection's request is not cut."""
    s = new()
    out = s.process([accept(inode=7), read(get("/old")), write(OK), accept(inode=8), read(get("/new")),
                     SockClose(PID, 1, T(), FD, inode=7), cuda(), write(OK)])
    old, new_ = requests(out)
    assert (old.head.path, new_.head.path) == ("/old", "/new") and not new_.error and new_.status == 200
    assert len(new_.sink.calls) == 1 and s.stats.snapshot()["connection_closes_after_reuse"] == 1
    out = s.process([SockClose(PID, 1, T(), FD, inode=8), read(get("/after"))])
    assert s.procs[PID].conns[FD].inode is None  # its own close ended it: a read after is a new one's


def test_close_delimited_response_completes_on_close():
    s = new()
    out = s.process([accept(), read(get()), write(b"HTTP/1.0 200 OK\r\n\r\nbody..."),
                     SockClose(PID, 1, T(), FD)])
    (r,) = requests(out)
    assert r.status == 200 and r.error is None


def test_process_exit_closes_requests_and_emits_process_gone():
    s = new()
    s.process([accept(), read(get()), cuda()])
    s.process([accept(fd=12, pid=77), cuda(pid=77)])  # another process stays
    out = s.process([ProcExit(PID, T())])
    (r,) = requests(out)
    assert r.error == "process exited"
    assert isinstance(out[-1], ProcessGone) and out[-1].tgid == PID
    assert PID not in s.procs and 77 in s.procs


def test_process_exit_hands_on_its_windows():
    s = new()
    s.process([cuda()])
    out = s.process([ProcExit(PID, T())])
    assert [type(x).__name__ for x in out] == ["ProcessWindow", "ProcessGone"]
    assert flush_windows(s) == []


@pytest.mark.parametrize("raw", [b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03", b"*1\r\n$4\r\nPING\r\n"])
def test_bytes_of_no_known_protocol_give_no_request_and_are_counted(raw):
    s = new()
    out = s.process([accept(), read(raw), read(get()), write(OK), SockClose(PID, 1, T(), FD)])
    assert requests(out) == []
    assert s.stats.snapshot()["connections_unknown_protocol"] == 1


def test_bytes_http1_refuses_give_no_request_and_are_counted():
    s = new()
    out = s.process([accept(), read(b"GET /x HTTP/1.2\r\n\r\n"), read(get()), write(OK), SockClose(PID, 1, T(), FD)])
    assert requests(out) == []
    assert s.stats.snapshot()["http_parse_errors"] == 1


def test_malformed_response_drops_the_request_with_an_error():
    s = new()
    out = s.process([accept(), read(get()), write(b"<html>not http</html>")])
    (r,) = requests(out)
    assert r.error == "malformed HTTP response"
    assert s.stats.snapshot()["http_response_errors"] == 1


def test_kernel_rollups_appear_in_the_outside_window():
    s = new()
    rollups(s, [(PID, CALL_LAUNCH_KERNEL, 0xAB, 40, 0, 0),
                          (PID, CALL_MEMCPY, 1, 3, 3000, 90),      # func = direction h2d
                          (PID, CALL_DEVICE_SYNC, 0, 2, 0, 5000)], now_ns=5_000_000)
    rollups(s, [(PID, CALL_LAUNCH_KERNEL, 0xAB, 2, 0, 0)], now_ns=6_000_000)
    (w,) = flush_windows(s)
    assert w.attribution == "outside" and w.end_ns == 6_000_000
    assert w.sink.rollups[(CALL_LAUNCH_KERNEL, 0xAB)].count == 42
    sm = w.sink.summary
    assert (sm.launches, sm.memcpy_bytes, sm.sync_ns, sm.kernels) == (42, {"h2d": 3000}, 5000, {0xAB})
    assert w.sink.calls == []
    assert s.attributed["outside"] == 47


def test_set_device_is_not_a_child_span():
    s = new()
    out = s.process([accept(), read(get()), cuda("cudaSetDevice", kind=3), cuda(), write(OK)])
    (r,) = requests(out)
    assert [c.call for c, _ in r.sink.calls] == [CALL_LAUNCH_KERNEL]
    assert r.sink.summary.calls == 1
    assert s.procs[PID].device_by_tid == {1: 3}
    assert flush_windows(s) == []


def test_connection_seen_without_its_accept():
    s = WithFacts(Stitcher(rng=random.Random(2)), port_of=lambda pid, lfd, fd: 8000)
    (r,) = requests(s.process([read(get()), write(OK)]))
    assert r.peer_addr is None and r.server_port == 8000


def test_close_all_finishes_open_requests():
    s = new()
    s.process([accept(), read(get()), cuda(tid=5)])
    s.process([accept(fd=11), read(get("/b"), fd=11, tid=2), cuda(tid=5)])  # ambiguous
    out = s.process([Tick(T(), final=True)])
    reqs = requests(out)
    assert len(reqs) == 2 and all(r.error == "collector stopped" for r in reqs)
    assert [w.attribution for w in out if isinstance(w, ProcessWindow)] == ["ambiguous"]


def test_response_head_longer_than_the_copy_does_not_shift_requests():
    s = new()
    big = b"HTTP/1.1 200 OK\r\nContent-Length: 2\r\nX-Policy: " + b"p" * 1500 + b"\r\n\r\nok"
    out = s.process([accept(), read(get("/one")), write(big), read(get("/two")), write(OK)])
    assert [r.head.path for r in requests(out)] == ["/one", "/two"]


def test_expect_100_continue_flow():
    s = new()
    head = b"POST /infer/1 HTTP/1.1\r\nExpect: 100-continue\r\nContent-Length: 3000\r\n\r\n"
    out = s.process([accept(), read(head), write(b"HTTP/1.1 100 Continue\r\n\r\n"),
                     read(b"x" * 3000), cuda(), write(OK)])
    (r,) = requests(out)
    assert (r.head.method, r.status, r.error) == ("POST", 200, None)
    assert len(r.sink.calls) == 1


def test_thread_with_a_half_read_head_is_not_given_to_another_request():
    """Thread 2 read half a head (a request we cannot see); while a real request is
    open on thread 1, thread 2's calls are ambiguous, never that request's."""
    s = new()
    out = s.process([accept(fd=9, tid=2), read(b"GET /work?launches=5 ", fd=9, tid=2),
                     accept(), read(get("/a")), cuda(tid=2), write(OK)])
    (req,) = requests(out)
    assert req.sink.calls == [] and req.sink.summary.ambiguous == 1
    assert s.attributed["ambiguous"] == 1 and s.attributed["process"] == 0


def test_kernel_rollups_span_the_interval_since_the_previous_read():
    s = new()
    rollups(s, [(PID, CALL_LAUNCH_KERNEL, 0xAB, 3, 0, 0)], now_ns=9_000_000, since_ns=4_000_000)
    (w,) = flush_windows(s)
    assert (w.start_ns, w.end_ns) == (4_000_000, 9_000_000) and w.sink.summary.launches == 3


TLS = b"\x16\x03\x01\x02\x00\x01\x00\x01\xfc\x03"


def test_thread_serving_a_connection_that_is_not_http_gives_no_thread_attribution():
    """Thread 2 also serves a TLS connection (its requests are invisible): its calls
    are ambiguous, never the one request it is known to serve; once that connection is
    gone (its fd accepted anew), the thread rule is back."""
    s = new()
    out = s.process([accept(fd=9, tid=2), read(TLS, fd=9, tid=2), accept(fd=10, tid=2),
                     read(get("/a"), fd=10, tid=2), cuda(tid=2)])
    assert s.attributed["ambiguous"] == 1 and s.attributed["thread"] == 0
    out = s.process([accept(fd=9, tid=2), cuda(tid=2), write(OK, fd=10, tid=2)])
    (r,) = requests(out)
    assert [a for _, a in r.sink.calls] == ["thread"] and r.sink.summary.ambiguous == 1
    assert s.procs[PID].broken == {}


def test_thread_serving_a_connection_that_is_not_http_gives_no_process_attribution():
    s = new()
    out = s.process([accept(fd=9, tid=3), read(TLS, fd=9, tid=3), accept(), read(get("/a")), cuda(tid=3),
                     write(OK)])
    (r,) = requests(out)
    assert r.sink.calls == [] and r.sink.summary.ambiguous == 1
    assert s.attributed["process"] == 0 and s.attributed["ambiguous"] == 1


def test_calls_without_a_python_context_keep_the_thread_rules_beside_tracked_contexts():
    """ctx == 0 (not Python, or an interpreter the probes cannot read): the thread and
    process rules hold even on a thread where contexts are copied."""
    from otel_gpu.records import ContextCopy
    s = new()
    out = s.process([accept(), read(get("/a")), ContextCopy(PID, 1, T(), 0x77, 0x1), cuda(tid=1), cuda(tid=8),
                     write(OK)])
    (r,) = requests(out)
    assert sorted((c.tid, a) for c, a in r.sink.calls) == [(1, "thread"), (8, "process")]  # thread calls land at its end


def test_a_connection_read_through_the_ssl_probes_gives_https_requests():
    from dataclasses import replace
    s = Stitcher()
    s.process([accept(), accept(fd=FD + 1)])
    out = s.process([replace(read(get("/secure")), tls=True), write(OK),
                     read(get("/plain"), fd=FD + 1), write(OK, fd=FD + 1)])
    done = {r.head.path: r for r in out if isinstance(r, Request)}
    assert done["/secure"].tls is True and done["/plain"].tls is False


def test_requests_begun_before_the_process_s_probes_attached_say_so():
    """Discovery traces a process it finds at once and attaches its CUDA probes after
    (--exe: ~0.3 s): a request begun before they were attached may have made calls
    nobody saw, and is marked; one begun after is not. The ProcessSeen passes on once."""
    s = new()
    begun = [accept(), read(get("/infer/early"))]  # in the ring buffer while the probes attached
    probes_from = T()
    out = s.process([ProcessSeen(PID, probes_from)] + begun
                    + [cuda(), write(OK), read(get("/infer/late")), cuda(), write(OK)])
    early, late = requests(out)
    assert early.before_probes and not late.before_probes
    assert (early.head.path, late.head.path) == ("/infer/early", "/infer/late")
    assert [type(r) for r in out].count(ProcessSeen) == 1
    assert s.stats.snapshot().get("requests_before_probes") == 1
