"""The CUDA call table: one row per call, everything else derived from it."""
import re

from otel_gpu import records
from otel_gpu.cuda_calls import (BY_ID, CALLS, Category, DRIVER, HIP, NCCL, ROLLUP_DETAIL, RUNTIME, SHAPE_OF,
                                 c_defines, call_name)
from otel_gpu.probes.rows import CUDA_PROBES, HIP_GRAPH_PROBES, rows_for

RECORD_OF_SHAPE = {"launch": records.LaunchCall, "memcpy": records.MemcpyCall, "memory": records.MemoryCall,
                   "sync": records.SyncCall, "graph": records.GraphCall, "device": records.DeviceCall,
                   "handle": records.KernelHandle, "nccl": records.NcclCall,
                   "graph_op": records.GraphOp}


def test_ids_names_and_constants_are_unique():
    for key in ("id", "name", "const"):
        values = [getattr(c, key) for c in CALLS]
        assert len(values) == len(set(values)), key
    assert all(c.id > 0 and re.fullmatch(r"[A-Z0-9_]+", c.const) for c in CALLS)


def test_every_category_has_a_shape_a_record_and_a_rollup_meaning():
    for category in Category:
        assert category in SHAPE_OF and category in ROLLUP_DETAIL
        assert SHAPE_OF[category].value in RECORD_OF_SHAPE


def test_each_row_names_its_api_symbol_and_library():
    for c in CALLS:
        # every symbol is the API name or a variant of it (_ptsz, _spt), or its C++ mangling
        assert c.name in c.symbols and all(s.startswith(c.name) or c.name in s[:40] for s in c.symbols)
        assert c.library == (NCCL if c.name.startswith("nccl") else
                             HIP if c.name.lstrip("_").startswith("hip") else
                             DRIVER if c.name.startswith("cu") and not c.name.startswith("cuda") else RUNTIME)
        assert c.api == ("hip" if c.library == HIP else "cuda")
        # A handle's call reads its out-parameter at return, in a return handler of its own.
        want_ret = f"{c.entry}_return" if c.category in (Category.NAME, Category.GRAPH_OP) else "cuda_call_return"
        assert c.entry and (c.ret is None or c.ret == want_ret)
        # HIP's handlers are its own (bpf/hip_probes.c): a call's id is what its record carries
        assert c.entry.startswith("hip_") == (c.library == HIP)


def test_hip_graph_ops_are_served_by_the_cuda_runtime_handlers():
    """Same ABI, and graph ops are never spans: HIP's capture feeds pipeline/graphs.py as CUDA's does."""
    runtime = {(c.entry, c.ret) for c in CALLS if c.library == RUNTIME and c.category is Category.GRAPH_OP}
    assert {(r.entry, r.ret) for r in HIP_GRAPH_PROBES} <= runtime
    assert all(r.library == HIP and r.symbol.startswith("hip") for r in HIP_GRAPH_PROBES)
    assert set(HIP_GRAPH_PROBES) <= set(rows_for(HIP))


def test_the_allocation_test_of_the_return_handler_is_generated_from_the_table():
    allocs = [c for c in CALLS if c.category is Category.ALLOC]
    assert {c.name for c in allocs} == {"cudaMalloc", "hipMalloc"}
    line = next(l for l in c_defines().splitlines() if l.startswith("#define CALL_IS_ALLOC(c)"))
    assert all(f"(c) == CALL_{c.const}" in line for c in allocs)
    syncs = [c for c in CALLS if c.category is Category.SYNC]
    line = next(l for l in c_defines().splitlines() if l.startswith("#define CALL_IS_SYNC(c)"))
    assert len(syncs) == 6 and all(f"(c) == CALL_{c.const}" in line for c in syncs)


def test_probe_rows_are_derived_one_per_symbol():
    assert len(CUDA_PROBES) == sum(len(c.symbols) for c in CALLS)
    assert {r.symbol for r in rows_for(DRIVER)} == {s for c in CALLS if c.library == DRIVER for s in c.symbols}
    assert set(rows_for(RUNTIME)) | set(rows_for(DRIVER)) | set(rows_for(NCCL)) | set(rows_for(HIP)) >= set(CUDA_PROBES)


def test_c_defines_carry_every_id():
    text = c_defines()
    for c in CALLS:
        assert f"#define CALL_{c.const} {c.id}\n" in text
    assert f"#define CALL_MAX {max(BY_ID) + 1}\n" in text


def test_unknown_ids_are_named_not_fatal():
    assert call_name(9999) == "cuda_call_9999"
    assert records.CudaCall(1, 1, 0, 9999, 0).spec is None
