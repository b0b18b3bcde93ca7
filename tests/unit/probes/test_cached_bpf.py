"""probes/cached_bpf.py CachedBPF.preload where no thread can start (the interpreter is
exiting): nothing is loaded ahead, and each function loads at its attach as it would
one by one; the entry is never taken for a bad one (that compiled the program again)."""
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
