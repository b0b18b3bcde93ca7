"""probes/cached_bpf.py CachedBPF.preload where no thread can start (the interpreter is
exiting): nothing is loaded ahead, and each function loads at its attach as it would
one by one; the entry is never taken for a bad one (that compiled the program again);
and a single function loaded beside its caller does load on a thread."""
import types

import pytest


def test_loads_ahead_that_cannot_start_leave_each_function_to_its_attach(monkeypatch):
    pytest.importorskip("bcc")
    from otel_gpu.probes import cached_bpf

    class Loads(cached_bpf.CachedBPF):
        def __init__(self) -> None:  # none of bcc's state: only what preload and load_func use
            self.funcs, self._loading, self.loaded = {}, {}, []

        def _load(self, name, prog_type, device=None, attach_type=-1):
            self.loaded.append(name)
            fn = self.funcs[name] = types.SimpleNamespace(fd=len(self.funcs))
            return fn

    def refused(self, *args, **kwargs):
        raise RuntimeError("cannot schedule new futures after interpreter shutdown")

    monkeypatch.setattr(cached_bpf.os, "cpu_count", lambda: 2)
    monkeypatch.setattr(cached_bpf.ThreadPoolExecutor, "submit", refused)
    bpf = Loads()
    bpf.preload([b"a", b"b"], 5)
    assert bpf._loading == {} and not bpf.loading([b"a", b"b"]) and bpf.loaded == []
    assert [bpf.load_func(n, 5).fd for n in (b"a", b"b")] == [0, 1] and bpf.loaded == [b"a", b"b"]


def test_one_function_loaded_beside_the_caller_is_loaded_on_a_thread(monkeypatch):
    """preload(beside=True) with one function (bpf/h2_walk.c): on a thread even so, or the
    caller (the poll loop) would wait on its verifier, and a new library's probes with it
    (first requests missed). Without `beside`, one function is left to its attach."""
    import threading

    pytest.importorskip("bcc")
    from otel_gpu.probes import cached_bpf

    class HeldLoads(cached_bpf.CachedBPF):
        def __init__(self) -> None:  # none of bcc's state: only what preload and load_func use
            self.funcs, self._loading, self.release, self.threads = {}, {}, threading.Event(), []

        def _load(self, name, prog_type, device=None, attach_type=-1):
            self.threads.append(threading.current_thread().name)
            assert self.release.wait(10)
            fn = self.funcs[name] = types.SimpleNamespace(fd=7)
            return fn

    monkeypatch.setattr(cached_bpf.os, "cpu_count", lambda: 1)
    bpf = HeldLoads()
    bpf.preload([b"alone"], 5)
    assert bpf._loading == {}  # left to its attach
    bpf.preload([b"alone"], 5, beside=True)
    assert bpf.loading([b"alone"])  # the caller is not held by the verifier
    bpf.release.set()
    assert bpf.load_func(b"alone", 5).fd == 7 and bpf.threads[0].startswith("bpf-load")
