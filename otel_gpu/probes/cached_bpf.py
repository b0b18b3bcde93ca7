"""A bcc BPF object made from a program_cache Entry instead of a clang compile.

Everything after the compile stays bcc's: tables (bcc.table classes), probes and
tracepoints (attach_*), the ring buffer, cleanup. Only what bcc reads from its
compiled module is answered from the entry: function instructions (load_func), the
autoloaded TRACEPOINT_PROBE functions (_trace_autoload), and the three facts bcc's
tables ask libbcc about a map (type, flags, max entries). So libLLVM/libclang are
never touched on a cache hit. Programs load without BTF (none of ours needs it:
no spin locks, kfuncs or global functions); the verifier checks them as always."""
from __future__ import annotations

import atexit
import ctypes as ct
import json
import logging
import os
from concurrent.futures import ThreadPoolExecutor
from typing import Optional

import bcc
import bcc.table
from bcc import BPF
from bcc.libbcc import lib

from . import uprobe_multi
from .program_cache import CacheError, Entry, FuncSpec, MapSpec, Uncacheable, relocate_in, relocate_out

_AUTOLOAD = {b"tracepoint__": BPF.TRACEPOINT, b"raw_tracepoint__": BPF.RAW_TRACEPOINT}
# bcc would attach these itself too; this module does not implement them, so refuses to cache.
_OTHER_AUTOLOAD = (b"kprobe__", b"kretprobe__", b"kfunc__", b"kretfunc__", b"lsm__")
_QUEUE_STACK = (bcc.table.BPF_MAP_TYPE_QUEUE, bcc.table.BPF_MAP_TYPE_STACK)
log = logging.getLogger(__name__)
MAX_LOAD_THREADS = 8  # functions verified at once (preload): a node's cores are its workload's

# Our own function objects of libbcc: argtypes set here change nobody else's.
_lib = ct.CDLL(lib._name, use_errno=True)
_lib.bcc_create_map.restype = ct.c_int
_lib.bcc_create_map.argtypes = [ct.c_int, ct.c_char_p, ct.c_int, ct.c_int, ct.c_int, ct.c_int]
_lib.bcc_prog_load.restype = ct.c_int
_lib.bcc_prog_load.argtypes = [ct.c_int, ct.c_char_p, ct.c_void_p, ct.c_int, ct.c_char_p, ct.c_uint,
                               ct.c_int, ct.c_char_p, ct.c_uint]
_lib.bpf_obj_get_info.restype = ct.c_int
_lib.bpf_obj_get_info.argtypes = [ct.c_int, ct.c_void_p, ct.POINTER(ct.c_uint32)]
_lib.bpf_num_tables.restype = ct.c_ulonglong
_lib.bpf_num_tables.argtypes = [ct.c_void_p]
_lib.bpf_table_name.restype = ct.c_char_p
_lib.bpf_table_name.argtypes = [ct.c_void_p, ct.c_ulonglong]


class _MapInfo(ct.Structure):  # the head of the kernel's struct bpf_map_info
    _fields_ = [("type", ct.c_uint32), ("id", ct.c_uint32), ("key_size", ct.c_uint32),
                ("value_size", ct.c_uint32), ("max_entries", ct.c_uint32), ("map_flags", ct.c_uint32),
                ("name", ct.c_char * 16), ("_rest", ct.c_uint8 * 104)]  # zeroed: the kernel's tail check


def _as_bytes(name) -> bytes:
    """A map or program name as bcc keeps it. bcc's own check warns (DeprecationWarning)
    for every str, and the collector names its maps and programs in str."""
    return name.encode() if isinstance(name, str) else name


def map_fds(bpf) -> set[int]:
    """The descriptors of a program's maps: a program from the cache (CachedBPF) or bcc's
    own compiled one."""
    mod = bpf.module
    if isinstance(mod, CachedModule):
        return set(mod.fds)
    if mod is None:  # cleaned up: bcc freed its module
        return set()
    return {lib.bpf_table_fd(mod, _lib.bpf_table_name(mod, i)) for i in range(_lib.bpf_num_tables(mod))}


def map_name(fd: int) -> Optional[str]:
    """The kernel's name of the map behind `fd` (its first 15 characters), or None."""
    info, size = _MapInfo(), ct.c_uint32(ct.sizeof(_MapInfo))
    if _lib.bpf_obj_get_info(fd, ct.byref(info), ct.byref(size)) != 0:
        return None
    return info.name.decode(errors="replace") or None


# --- compiled -> entry -----------------------------------------------------------------
def extract(bpf) -> Entry:
    """Every function and map of a compiled bcc BPF object (loaded or not yet).
    Raises Uncacheable when the entry could not reproduce it."""
    mod, maps, fd_to_index = bpf.module, [], {}
    for i in range(_lib.bpf_num_tables(mod)):
        name = _lib.bpf_table_name(mod, i)
        fd = lib.bpf_table_fd(mod, name)
        info, size = _MapInfo(), ct.c_uint32(ct.sizeof(_MapInfo))
        if fd < 0 or _lib.bpf_obj_get_info(fd, ct.byref(info), ct.byref(size)) != 0:
            raise Uncacheable(f"map {name.decode()}: no fd or no info (errno {ct.get_errno()})")
        fd_to_index[fd] = len(maps)
        maps.append(MapSpec(name.decode(), info.type, info.key_size, info.value_size, info.max_entries,
                            info.map_flags, (lib.bpf_table_key_desc(mod, name) or b"").decode(),
                            (lib.bpf_table_leaf_desc(mod, name) or b"").decode()))
    funcs = []
    for i in range(lib.bpf_num_functions(mod)):
        name = lib.bpf_function_name(mod, i)
        if name.startswith(_OTHER_AUTOLOAD):
            raise Uncacheable(f"{name.decode()}: autoload kind not implemented by the cache")
        code = ct.string_at(lib.bpf_function_start(mod, name), lib.bpf_function_size(mod, name))
        try:
            insns, relocs = relocate_out(code, fd_to_index)
        except Uncacheable as e:
            raise Uncacheable(f"{name.decode()}: {e}") from None
        funcs.append(FuncSpec(name.decode(), insns, relocs))
    return Entry(lib.bpf_module_license(mod).decode(), lib.bpf_module_kern_version(mod), tuple(maps), tuple(funcs))


def load_ahead(bpf, names, prog_type, attach_type=-1, beside: bool = False) -> bool:
    """CachedBPF.preload where `bpf` is a program from the cache; False for bcc's own
    compiled module, which is not known to load safely from two threads (its functions
    load one by one at their attach)."""
    if not isinstance(bpf, CachedBPF):
        return False
    bpf.preload(names, prog_type, attach_type, beside)
    return True


# --- entry -> BPF object -----------------------------------------------------------------
class CachedModule:
    """Stands where bcc keeps its compiled module's pointer: the maps we created and
    the entry. Not a pointer: handed to libbcc by mistake, ctypes refuses it
    (ArgumentError) instead of libbcc reading garbage."""

    def __init__(self, entry: Entry) -> None:
        self.entry, self.fds = entry, []
        self.index = {m.name.encode(): i for i, m in enumerate(entry.maps)}
        self.funcs = {f.name.encode(): f for f in entry.funcs}
        try:
            for m in entry.maps:
                fd = _lib.bcc_create_map(m.type, m.name.encode(), m.key_size, m.value_size, m.max_entries, m.flags)
                if fd < 0:
                    raise CacheError(f"map {m.name}: create failed ({os.strerror(ct.get_errno())})")
                self.fds.append(fd)
        except BaseException:
            self.close()
            raise

    def close(self) -> None:
        for fd in self.fds:
            os.close(fd)
        self.fds = []


class _TableLib:
    """bcc.table's `lib`: the map facts bcc's tables read at construction come from a
    CachedModule; every other call, and every other module, goes to libbcc."""

    def __init__(self, real) -> None:
        self._real = real

    def __getattr__(self, name):
        return getattr(self._real, name)

    def bpf_table_type_id(self, module, map_id):
        if isinstance(module, CachedModule):
            return module.entry.maps[map_id].type
        return self._real.bpf_table_type_id(module, map_id)

    def bpf_table_flags_id(self, module, map_id):
        if isinstance(module, CachedModule):
            return module.entry.maps[map_id].flags
        return self._real.bpf_table_flags_id(module, map_id)

    def bpf_table_max_entries_id(self, module, map_id):
        if isinstance(module, CachedModule):
            return module.entry.maps[map_id].max_entries
        return self._real.bpf_table_max_entries_id(module, map_id)


def _install_table_lib() -> None:
    if not isinstance(bcc.table.lib, _TableLib):
        bcc.table.lib = _TableLib(bcc.table.lib)


class CachedBPF(BPF):
    """bcc.BPF without the compile. The attributes are the ones bcc's __init__ sets
    (bcc 0.26; the cache key holds bcc's version)."""

    def __init__(self, entry: Entry) -> None:
        _install_table_lib()
        self.kprobe_fds, self.uprobe_fds, self.tracepoint_fds = {}, {}, {}
        self.raw_tracepoint_fds, self.kfunc_entry_fds, self.kfunc_exit_fds, self.lsm_fds = {}, {}, {}, {}
        self.perf_buffers, self.open_perf_events = {}, {}
        self._ringbuf_manager = None
        self.tracefile = None
        self.debug = 0
        self.funcs, self.tables = {}, {}
        self._loading: dict = {}  # name -> Future of a load started ahead (preload)
        self.module = None
        self.module = CachedModule(entry)
        atexit.register(self.cleanup)
        try:
            self._trace_autoload()
        except BaseException:
            self.cleanup()
            raise

    def relocated(self, name: bytes) -> bytes:
        """The instructions of function `name` as loaded: this process's map fds written in."""
        if name not in self.module.funcs:
            raise Exception("Unknown program %s" % name)
        return relocate_in(self.module.funcs[name], self.module.fds)

    def load_func(self, func_name, prog_type, device=None, attach_type=-1):
        func_name = _as_bytes(func_name)
        ahead = self._loading.pop(func_name, None)
        fn = ahead.result() if ahead is not None else self.funcs.get(func_name)
        # None: not loaded yet, or its load ahead failed (loaded again here, to say why)
        return fn if fn is not None else self._load(func_name, prog_type, device, attach_type)

    def _load(self, func_name: bytes, prog_type, device=None, attach_type=-1):
        code = self.relocated(func_name)
        entry = self.module.entry
        if (prog_type, attach_type) == (BPF.KPROBE, uprobe_multi.BPF_TRACE_UPROBE_MULTI) and device is None:
            try:  # libbcc's bcc_prog_load takes no expected attach type
                fd = uprobe_multi.load_program(func_name, code, entry.license.encode())
            except OSError as e:
                raise Exception("Failed to load BPF program %s: %s" % (func_name, e.strerror)) from None
        elif device is not None or attach_type != -1:
            raise Exception("the cached program loads no device or other attach-type programs")
        else:
            fd = _lib.bcc_prog_load(prog_type, func_name, code, len(code), entry.license.encode(),
                                    entry.kern_version, 0, None, 0)
        if fd < 0:
            raise Exception("Failed to load BPF program %s: %s" % (func_name, os.strerror(ct.get_errno())))
        fn = BPF.Function(self, func_name, fd)
        self.funcs[func_name] = fn
        return fn

    def preload(self, names, prog_type, attach_type=-1, beside: bool = False) -> None:
        """Starts loading the functions not loaded yet, in the order given, MAX_LOAD_THREADS
        at most at once; load_func takes each as it is done. The verifier is most of a
        start's attach time and a load is a syscall that lets go of the GIL, so the probes
        attach in their order, each as soon as its own function is verified, while the
        next ones are verified beside it (a file's launch probe does not wait for the rest:
        a server's first requests). A load that fails here is done again by load_func,
        which says why as it always did. Only the caller's thread calls load_func.
        `beside`: loaded on a thread even when there is one function: the caller goes on
        meanwhile (a program verified beside the poll loop)."""
        todo = [n for n in dict.fromkeys(n.encode() if isinstance(n, str) else n for n in names)
                if n not in self.funcs and n not in self._loading]
        workers = min(len(todo), os.cpu_count() or 1, MAX_LOAD_THREADS)
        if workers < 2 and not (beside and todo):
            return  # one by one at each attach, as before

        def load(name):
            try:
                return self._load(name, prog_type, attach_type=attach_type)
            except Exception:
                return None
        pool = ThreadPoolExecutor(workers, thread_name_prefix="bpf-load")
        try:
            for name in todo:
                self._loading[name] = pool.submit(load, name)
        except RuntimeError as e:  # no new threads (the interpreter is exiting): the rest one by one
            log.debug("functions not loaded ahead: %s", e)
        pool.shutdown(wait=False)  # its threads end with the last load

    def loading(self, names) -> bool:
        """Whether any of `names` is still being loaded ahead (preload)."""
        return any(not f.done() for f in (self._loading.get(n) for n in names) if f is not None)

    def _trace_autoload(self) -> None:
        autoload = [(name, prefix, prog_type) for name in (f.name.encode() for f in self.module.entry.funcs)
                    for prefix, prog_type in _AUTOLOAD.items() if name.startswith(prefix)]
        for prog_type in _AUTOLOAD.values():  # verified side by side, attached in order
            self.preload([name for name, _, t in autoload if t == prog_type], prog_type)
        for name, prefix, prog_type in autoload:
            fn = self.load_func(name, prog_type)
            if prog_type == BPF.TRACEPOINT:
                self.attach_tracepoint(tp=name[len(prefix):].replace(b"__", b":"), fn_name=fn.name)
            else:
                self.attach_raw_tracepoint(tp=name[len(prefix):], fn_name=fn.name)

    def get_table(self, name, keytype=None, leaftype=None, reducer=None):
        name = _as_bytes(name)
        if name not in self.module.index:
            raise KeyError(name)
        map_id = self.module.index[name]
        spec = self.module.entry.maps[map_id]
        if not keytype and spec.type not in _QUEUE_STACK:
            keytype = BPF._decode_table_type(json.loads(spec.key_desc))
        if not leaftype:
            leaftype = BPF._decode_table_type(json.loads(spec.leaf_desc))
        return bcc.table.Table(self, map_id, self.module.fds[map_id], keytype, leaftype, name, reducer=reducer)

    def dump_func(self, func_name):
        return self.relocated(_as_bytes(func_name))

    def close(self) -> None:
        for ahead in self._loading.values():  # none left loading behind the closes
            ahead.result()
        self._loading.clear()
        for name, fn in list(self.funcs.items()):
            os.close(fn.fd)
            del self.funcs[name]
        if self.module:
            self.module.close()
            self.module = None
