"""The collector under a sampler that samples every root (the default,
parentbased_always_on): the kernel's head programs load only once an incoming
traceparent says "not sampled", and then decide by ALL_ROOTS with the parent's flag
(pipeline/sampling.py bound_once_parents_unsampled). The BPF program is a fake that
records what it is told."""
from otel_gpu.collector import Collector
from otel_gpu.config import Config
from otel_gpu.pipeline.sampling import ALL_ROOTS
from otel_gpu.records import EV_SOCK_READ, Accept, SockIo

PID, TID, FD = 4242, 4243, 10
TRACE = "4bf92f3577b34da6a3ce929d0e0e4736"


class FakeProgram:
    def __init__(self):
        self.heads = []

    def sample_heads(self, bound, parents, wait=True):
        self.heads.append((bound, parents, wait))

    def set_quiet(self, by_pid):
        pass


def collector(tmp_path, **config):
    c = Collector(Config(proc_root=str(tmp_path), **config))
    c.program = FakeProgram()
    return c


def read_head(c, n: int, flags=None) -> None:
    """Request n, on a connection of its own."""
    parent = "" if flags is None else f"traceparent: 00-{TRACE}-{n + 1:016x}-{flags}\r\n"
    head = f"GET /work?n={n} HTTP/1.1\r\nHost: x\r\n{parent}\r\n".encode()
    c._push([Accept(PID, TID, 1000 + n, FD + n, 3, "127.0.0.1", 5000 + n),
             SockIo(EV_SOCK_READ, PID, TID, 2000 + n, FD + n, len(head), head, b"", epoch=n + 1, req_start=True)])


def test_the_kernel_decides_once_an_unsampled_parent_arrives(tmp_path):
    c = collector(tmp_path)
    read_head(c, 0)           # a root
    read_head(c, 1, "01")     # a sampled parent
    assert c.program.heads == [] and c.wiring.stitcher.http.kernel_bound is None
    read_head(c, 2, "00")     # not sampled: from now on the kernel decides
    assert c.program.heads == [(ALL_ROOTS, True, False)] and c.wiring.stitcher.http.kernel_bound == ALL_ROOTS
    read_head(c, 3, "00")
    assert c.program.heads == [(ALL_ROOTS, True, False)]  # once


def test_samplers_the_kernel_decides_from_the_start_defer_nothing(tmp_path):
    """A ratio sampler's programs load at start (Collector.start), and a sampler that
    ignores parents has nothing to learn from one."""
    for sampler, arg in (("parentbased_traceidratio", "0.5"), ("always_on", None), ("traceidratio", "1")):
        c = collector(tmp_path, traces_sampler=sampler, traces_sampler_arg=arg)
        read_head(c, 0, "00")
        assert c.program.heads == [], sampler
