"""The compiled-program cache in the real kernel: a cached program is the compiled one
(same instructions for every function once each map reference is resolved to its
map, same kernel program tags), a damaged entry falls back to compiling (counted),
and `otel-gpu compile` warms the cache that a collector then starts from and traces
with. A cold clang compile takes 15-20 s on 2 cores: the module makes two (`make setup`
compiled the default cache's entry)."""
from __future__ import annotations

import base64
import ctypes as ct
import hashlib
import json
import logging
import os
import shutil

import pytest

from otel_gpu.probes.program_cache import INSN, CacheError
from otel_gpu.probes.source import ProgramOptions, load, program_cache
from otel_gpu.probes.rows import CUDA_PROBES
from otel_gpu.ratelimit import Stats
from tests.bpf.probe_harness import open_fds
from tests.harness import children_of, server_spans, started


def _by_map_name(code: bytes, fd_names: dict) -> list:
    """Instructions with each map fd load's immediate replaced by the map's name."""
    out = []
    for off in range(0, len(code), INSN.size):
        op, regs, o, imm = INSN.unpack_from(code, off)
        if op == 0x18 and regs >> 4 == 1:  # ld_imm64 of a map fd (its second slot has op 0)
            imm = fd_names[imm]
        out.append((op, regs, o, imm))
    return out


def _prog_tag(fd: int) -> str:
    """The kernel's hash of a loaded program's instructions, map fds masked."""
    with open(f"/proc/self/fdinfo/{fd}") as f:
        return next(line.split()[1] for line in f if line.startswith("prog_tag:"))


class _Messages(logging.Handler):
    def __init__(self):
        super().__init__()
        self.lines = []

    def emit(self, record):
        self.lines.append(record.getMessage())


@pytest.fixture(scope="module")
def compiled(tmp_path_factory):
    """The default program as load() compiles it when the kernel refuses the cache's
    entry, the module's one compile through load() (15-20 s on 2 cores): the refused
    entry is the default cache's (`make setup` compiles it; without it, the first load
    here does), its first tracepoint program made one the verifier rejects, so the load
    fails after maps were made and tracepoints attached. (BPF, CacheDir, key, Stats,
    the load's log lines); the compile wrote a good entry again."""
    from otel_gpu.config import DEFAULT_BPF_CACHE
    from otel_gpu.probes.cached_bpf import CachedBPF
    default = ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE)
    load(default).cleanup()  # cached if it was not
    good, key = program_cache(default)
    options = ProgramOptions(bpf_cache=str(tmp_path_factory.mktemp("refused")))
    cache, same_key = program_cache(options)
    assert same_key == key  # the key does not depend on the cache's folder
    shutil.copy(good.entry_path(key), cache.entry_path(key))
    _kernel_refuses(cache.entry_path(key))
    stats, messages = Stats(), _Messages()
    logging.getLogger("otel_gpu.probes.source").addHandler(messages)
    try:
        bpf = load(options, stats)
    finally:
        logging.getLogger("otel_gpu.probes.source").removeHandler(messages)
    try:
        assert not isinstance(bpf, CachedBPF)
        yield bpf, cache, key, stats, messages.lines
    finally:
        bpf.cleanup()


@pytest.fixture
def good_entry(compiled):
    """The entry the compile wrote (each case copies it into a cache of its own)."""
    _, cache, key, _, _ = compiled
    return cache.entry_path(key)


def test_cached_program_equals_the_compiled_one(compiled):
    from bcc import BPF
    from bcc.libbcc import lib

    from otel_gpu.probes.cached_bpf import CachedBPF, _lib
    compiled, cache, key, _, _ = compiled
    entry = cache.read(key)
    maps_before = open_fds("bpf-map")
    cached = CachedBPF(entry)
    try:
        mod = compiled.module
        compiled_names = {lib.bpf_table_fd(mod, _lib.bpf_table_name(mod, i)): _lib.bpf_table_name(mod, i).decode()
                          for i in range(_lib.bpf_num_tables(mod))}
        cached_names = {fd: m.name for fd, m in zip(cached.module.fds, entry.maps)}
        assert sorted(compiled_names.values()) == sorted(cached_names.values())
        names = [lib.bpf_function_name(mod, i) for i in range(lib.bpf_num_functions(mod))]
        assert [f.name.encode() for f in entry.funcs] == names  # every function, in bcc's order
        refs = 0
        for name in names:
            theirs = _by_map_name(compiled.dump_func(name), compiled_names)
            ours = _by_map_name(cached.relocated(name), cached_names)
            assert ours == theirs, name
            refs += sum(1 for x in ours if isinstance(x[3], str))
        assert refs > 50  # the comparison did meet map references
        # Loaded by the kernel: the same programs (tags mask map fds), tracepoints attached alike.
        assert cached.num_open_tracepoints() == compiled.num_open_tracepoints() > 0
        handlers = sorted({r.entry for r in CUDA_PROBES} | {r.ret for r in CUDA_PROBES if r.ret})
        for name in [n.decode() for n in names if n.startswith(b"tracepoint__")] + handlers:
            kind = BPF.TRACEPOINT if name.startswith("tracepoint__") else BPF.KPROBE
            a, b = compiled.load_func(name.encode(), kind), cached.load_func(name.encode(), kind)
            assert _prog_tag(a.fd) == _prog_tag(b.fd), name
        # Tables: bcc's classes, types and sizes as compiled.
        for m in entry.maps:
            t1, t2 = compiled[m.name.encode()], cached[m.name.encode()]
            assert type(t1) is type(t2) and t1.max_entries == t2.max_entries and t1.flags == t2.flags
            if m.type != 27:  # ringbuf: no key/leaf
                assert ct.sizeof(t1.Key) == ct.sizeof(t2.Key) and ct.sizeof(t1.Leaf) == ct.sizeof(t2.Leaf)
        cached[b"traced"][ct.c_uint32(4242)] = ct.c_uint32(1)
        assert cached[b"traced"][ct.c_uint32(4242)].value == 1
        with pytest.raises(KeyError):
            compiled[b"traced"][ct.c_uint32(4242)]  # maps of its own
        cached.cleanup()
        assert open_fds("bpf-map") == maps_before  # and closed with it
    finally:
        cached.cleanup()


def test_functions_loaded_ahead_are_those_loaded_one_by_one(compiled):
    """CachedBPF.preload (the attacher's prepare: a file's handlers start verifying side by
    side, and each attach takes its own as soon as it is done): each function loaded
    once, the kernel's tags those of a load one by one; a name that could not load ahead
    is refused by load_func as it always was."""
    from bcc import BPF

    from otel_gpu.probes.cached_bpf import CachedBPF
    from otel_gpu.probes.uprobe_multi import BPF_TRACE_UPROBE_MULTI
    _, cache, key, _, _ = compiled
    entry = cache.read(key)
    handlers = sorted({r.entry for r in CUDA_PROBES} | {r.ret for r in CUDA_PROBES if r.ret})
    ahead, one_by_one = CachedBPF(entry), CachedBPF(entry)
    try:
        autoloaded = set(ahead.funcs)
        ahead.preload(handlers + handlers[::-1] + ["no_such_function"], BPF.KPROBE,
                      attach_type=BPF_TRACE_UPROBE_MULTI)
        assert len(ahead._loading) == (len(handlers) + 1 if (os.cpu_count() or 1) > 1 else 0)  # each name once
        loaded = [ahead.load_func(n.encode(), BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI) for n in handlers]
        assert sorted(n.decode() for n in set(ahead.funcs) - autoloaded) == handlers
        assert len({f.fd for f in ahead.funcs.values()}) == len(ahead.funcs)  # each loaded once
        for name, fn in zip(handlers, loaded):
            again = one_by_one.load_func(name.encode(), BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
            assert _prog_tag(fn.fd) == _prog_tag(again.fd), name
            assert ahead.load_func(name.encode(), BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI) is fn
        with pytest.raises(Exception, match="Unknown program"):
            ahead.load_func(b"no_such_function", BPF.KPROBE, attach_type=BPF_TRACE_UPROBE_MULTI)
    finally:
        ahead.cleanup()
        one_by_one.cleanup()


def test_a_compiled_program_loads_each_function_as_its_probe_attaches(compiled):
    """A cold start's program is bcc's own (its module is not known to load from two
    threads): prepare leaves every handler to its attach."""
    from otel_gpu.probes.uprobe_links import MultiLinks
    bpf = compiled[0]
    before = set(bpf.funcs)
    MultiLinks(bpf).prepare(sorted({r.entry for r in CUDA_PROBES}))
    assert set(bpf.funcs) == before


def _flip(path):
    data = bytearray(path.read_bytes())
    data[-20] ^= 0xFF
    path.write_bytes(bytes(data))


def _truncate(path):
    path.write_bytes(path.read_bytes()[:4096])


def _foreign(path):
    other = path.with_name("0" * 64 + ".bpfc")
    shutil.copy(path, other)
    path.write_bytes(other.read_bytes().replace(path.stem.encode(), other.stem.encode(), 1))
    other.unlink()


def _kernel_refuses(path):
    """A well-formed entry whose first tracepoint program the verifier rejects: the
    load fails after maps were created and some tracepoints attached."""
    head, _, body = path.read_bytes().partition(b"\n")
    doc = json.loads(body)
    exit_only = INSN.pack(0x95, 0, 0, 0)  # exit without setting r0
    func = next(f for f in doc["funcs"] if f["name"].startswith("tracepoint__"))
    func["insns"], func["relocs"] = base64.b64encode(exit_only).decode(), []
    body = json.dumps(doc).encode()
    parts = head.split(b" ")
    parts[5] = hashlib.sha256(body).hexdigest().encode()
    path.write_bytes(b" ".join(parts) + b"\n" + body)


@pytest.mark.parametrize("damage", [_flip, _truncate, _foreign])
def test_a_damaged_entry_is_refused(tmp_path, good_entry, damage):
    cache, key = program_cache(ProgramOptions(bpf_cache=str(tmp_path)))
    shutil.copy(good_entry, cache.entry_path(key))
    assert cache.read(key) is not None  # the good entry reads
    damage(cache.entry_path(key))
    with pytest.raises(CacheError):
        cache.read(key)


def test_an_entry_the_kernel_refuses_is_counted_and_the_program_compiled(compiled):
    """The later of the two refusals (an entry refused as read, above, takes the same
    path from load()'s one handler)."""
    from otel_gpu.probes.cached_bpf import CachedBPF
    bpf, cache, key, stats, lines = compiled
    options = ProgramOptions(bpf_cache=str(cache.path))
    assert bpf[b"traced"].max_entries == options.max_procs and bpf.num_open_tracepoints() > 0
    assert stats.snapshot().get("bpf_cache_invalid") == 1
    assert sum("unusable" in line for line in lines) == 1, lines
    again = load(options, stats)  # the compile rewrote a good entry
    try:
        assert isinstance(again, CachedBPF)
    finally:
        again.cleanup()
    assert stats.snapshot().get("bpf_cache_invalid") == 1


def _one_traced_request(collector, target, receiver):
    target.get("/work?launches=3&copies=2&h2d=1000&d2h=300")
    assert receiver.wait_for(lambda spans: any(s.attributes.get("http.route") == "/work"
                                               for s in server_spans(spans, target.pid)))
    span = next(s for s in server_spans(receiver.spans, target.pid) if s.attributes.get("http.route") == "/work")
    assert span.attributes["gpu.launches"] == 3
    assert sorted(c.name for c in children_of(receiver.spans, span)) == ["cudaLaunchKernel"] * 3 + ["cudaMemcpy"] * 2


def test_otel_gpu_compile_warms_the_cache_a_collector_then_reads_it(tmp_path, receiver, start_collector,
                                                                    start_target):
    """`otel-gpu compile` and `otel-gpu run` compile and look up one program (a compile
    from the cache's entry point, load(), is the module's `compiled`)."""
    import subprocess
    import sys

    from tests.harness import ROOT
    cache = str(tmp_path / "cache")
    cmd = [sys.executable, "-m", "otel_gpu.cli", "compile", "--bpf-cache", cache]
    first = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert first.returncode == 0 and "BPF program cached in" in first.stderr, first.stderr
    again = subprocess.run(cmd, capture_output=True, text=True, cwd=ROOT, timeout=300)
    assert again.returncode == 0 and "already holds this program" in again.stderr, again.stderr
    collector, target = started(start_collector, start_target, "--bpf-cache", cache)
    assert any("BPF program from the cache" in l for l in collector.log.lines), "".join(collector.log.lines)
    _one_traced_request(collector, target, receiver)
    assert len(os.listdir(cache)) == 1


def test_stream_settings_and_map_sizes_are_one_program():
    """Another --stream-rate, --stream-budget, --ringbuf-pages or --max-connections is the
    same program (one cache entry, no compile): each load writes its stream settings into
    the kernel's map (bpf/call_out.c) and makes the maps at its sizes."""
    from otel_gpu.config import DEFAULT_BPF_CACHE
    a = ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE, stream_budget=7, stream_rate=3001, ringbuf_pages=4,
                       max_conns=300)
    b = ProgramOptions(bpf_cache=DEFAULT_BPF_CACHE)
    assert program_cache(a)[1] == program_cache(b)[1]
    load(b).cleanup()  # cached if it was not
    bpf = load(a)
    try:
        s = bpf[b"stream_settings"][ct.c_int(0)]
        assert (s.budget, s.rate_per_cpu, s.high_water) == (7, -(-3001 // os.cpu_count()), 4 * 4096 // 16)
        assert (bpf[b"events"].max_entries, bpf[b"conns"].max_entries, bpf[b"ssl_fds"].max_entries) == \
            (4 * 4096, 300, 300)
        info = {}
        for name in (b"events", b"conns"):  # what the kernel made, not only what bcc was told
            with open(f"/proc/self/fdinfo/{bpf[name].map_fd}") as f:
                info[name] = int(next(l.split()[1] for l in f if l.startswith("max_entries:")))
        assert info == {b"events": 4 * 4096, b"conns": 300}
    finally:
        bpf.cleanup()
