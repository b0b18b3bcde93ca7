"""Kernel handles to names: the kernel_handle_event record, the per-process handle map
(enrich/symbols.py HandleMap), demangling, and the enrich stage learning from it."""
import pytest

from otel_gpu.kernel_io import abi
from otel_gpu.kernel_io.decode import KERNEL_HANDLE, DecodeError, decode
from otel_gpu.enrich.stage import Enrich
from otel_gpu.records import KernelHandle, ProcessGone
from otel_gpu.enrich.resources import ProcessResources
from otel_gpu.enrich.routes import RouteTemplater
from otel_gpu.enrich.symbols import HandleMap, KernelNames, demangle
from otel_gpu.cuda_calls import call_id
from tests.unit.pipeline.calls import cuda
from tests.unit.enrich.test_enrich import request

GET_FUNCTION, GET_KERNEL = call_id("cuModuleGetFunction"), call_id("__cudaGetKernel")


def handle_record(handle, name=b"", source=0, ret=0, flags=0):
    e = abi.KernelHandleEvent(h=abi.EventHeader(kind=abi.EV_KERNEL_HANDLE, flags=flags, tgid=7, tid=8, ts_ns=9),
                              call=GET_FUNCTION, ret=ret, handle=handle, source=source, name_len=len(name))
    fixed = abi.KernelHandleEvent.name.offset
    return bytes(e)[:fixed] + name  # the probe sends name_len bytes of the name


def test_the_decoder_reads_up_to_the_name():
    assert KERNEL_HANDLE.size == abi.KernelHandleEvent.name.offset


def test_a_named_handle_decodes_with_its_name():
    r = decode(handle_record(0xF00, b"_Z9my_kernelPf"))
    assert r == KernelHandle(7, 8, 9, GET_FUNCTION, 0, 0xF00, 0, "_Z9my_kernelPf")
    assert decode(handle_record(0xF00, source=0x401000)).source == 0x401000
    assert decode(handle_record(0xF00, source=0x401000)).name is None


def test_a_name_at_the_cap_is_marked_cut_and_a_bad_length_is_refused():
    full = b"k" * (abi.KERNEL_NAME_CAP - 1)
    assert decode(handle_record(1, full)).cut
    assert not decode(handle_record(1, b"k")).cut
    good = handle_record(1, b"abc")
    with pytest.raises(DecodeError):
        decode(good[:-1])  # shorter than name_len says
    with pytest.raises(DecodeError):
        decode(good + b"x")  # longer
    with pytest.raises(DecodeError):
        decode(good[:KERNEL_HANDLE.size - 1])
    assert decode(handle_record(1, b"ab", flags=abi.EV_FLAG_UNREADABLE)).unreadable


def h(handle, name=None, source=0, ret=0, pid=7, unreadable=False):
    return KernelHandle(pid, pid, 0, GET_FUNCTION, ret, handle, source, name, unreadable=unreadable)


def test_the_map_follows_function_to_kernel_to_name_and_to_a_host_stub():
    m = HandleMap()
    assert m.learn(h(0xA, "my_kernel"))            # cuLibraryGetKernel: CUkernel 0xA
    assert m.learn(h(0xB, source=0xA))            # cuKernelGetFunction: CUfunction 0xB of it
    assert m.learn(h(0xC, source=0x401000))       # __cudaGetKernel: handle 0xC for a host stub
    assert m.resolve(7, 0xA) == ("my_kernel", 0)
    assert m.resolve(7, 0xB) == ("my_kernel", 0)
    assert m.resolve(7, 0xC) == (None, 0x401000)  # symbolised as the host stub
    assert m.resolve(7, 0xD) == (None, 0xD)       # unknown: as it is
    assert m.resolve(8, 0xA) == (None, 0xA)       # another process's handles are its own


def test_the_map_ignores_what_names_nothing():
    m = HandleMap()
    assert not m.learn(h(0xA, "k", ret=500))         # the call failed
    assert not m.learn(h(0xA, "k", unreadable=True))
    assert not m.learn(h(0, "k"))
    assert not m.learn(h(0xA))                       # neither a name nor a source
    assert not m.learn(h(0x401000, source=0x401000))  # no GPU: the handle is the host stub
    assert len(m) == 0 and m.learned == 0


def test_a_cycle_ends():
    m = HandleMap()
    m.learn(h(0xA, source=0xB))
    m.learn(h(0xB, source=0xA))
    name, addr = m.resolve(7, 0xA)
    assert name is None and addr in (0xA, 0xB)


def test_the_map_is_bounded_and_forgets_a_process():
    m = HandleMap(max_entries=2)
    assert m.learn(h(1, "a")) and m.learn(h(2, "b", pid=8))
    assert m.learn(h(1, "a2"))  # a known handle is replaced, not added
    assert not m.learn(h(3, "c")) and m.dropped == 1 and len(m) == 2
    m.forget(7)
    assert len(m) == 1 and m.resolve(7, 1) == (None, 1)
    assert m.learn(h(3, "c"))


def test_mangled_names_are_demangled_others_kept():
    assert demangle("_Z9my_kernelPfi") == "my_kernel(float*, int)"
    assert demangle("triton_poi_fused_add_0") == "triton_poi_fused_add_0"
    assert demangle("_Z9my_ker") == "_Z9my_ker"  # cut at the cap: kept as it came


class StubSymbols:
    """CodeSymbols answering from a table of host stubs (real files:
    test_code_symbols.py)."""

    def __init__(self, stubs):
        self.stubs = stubs

    def name(self, pid, addr):
        return self.stubs.get(addr)

    def forget(self, pid):
        pass


def SymbolTable(stubs, **kw):
    return KernelNames(symbols=StubSymbols(stubs), **kw)


def test_names_come_from_the_map_and_a_later_handle_replaces_an_unnamed_lookup():
    names = SymbolTable({0x401000: "vec_add(float*)"})
    assert names(7, 0xC) is None
    names.learn(h(0xC, source=0x401000))
    assert names(7, 0xC) == "vec_add(float*)"
    names.learn(h(0xF, "_Z9my_kernelPf"))
    assert names(7, 0xF) == "my_kernel(float*)"
    assert names(7, 0x401000) == "vec_add(float*)"  # the runtime path as before
    names.forget(7)
    assert names(7, 0xF) is None


def test_enrich_learns_handles_names_launches_and_counts_the_unnamed(tmp_path):
    names = SymbolTable({})
    stage = Enrich(ProcessResources(str(tmp_path)), RouteTemplater([]), names)
    launch = lambda func: cuda("cudaLaunchKernel", pid=7, func=func)  # noqa: E731
    r = request(7, "/infer", [launch(0xF), launch(0xBAD)])
    out = stage.process([h(0xF, "_Z9my_kernelPf"), r])
    assert out == [r]  # handle records end here
    assert r.kernel_names == {0xF: "my_kernel(float*)", 0xBAD: None}  # spans show 0xbad, honestly
    assert stage.state()["kernel_unnamed"] == 1 and stage.state()["kernel_handles_learned"] == 1
    stage.process([ProcessGone(7)])
    assert len(names.handles) == 0
