"""The CUDA call table: one row per call, everything else derived from it."""
import re

from otel_gpu import records
from otel_gpu.cuda_calls import (BY_ID, CALLS, CUDA_PROBES, DRIVER, NCCL, ROLLUP_DETAIL, RUNTIME, SHAPE_OF,
                                 Category, c_defines, call_name, rows_for)

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
        assert c.name in c.symbols and all(s.startswith(c.name) for s in c.symbols)
        assert c.library == (NCCL if c.name.startswith("nccl") else
                             DRIVER if c.name.startswith("cu") and not c.name.startswith("cuda") else RUNTIME)
        # A handle's call reads its out-parameter at return, in a return handler of its own.
        want_ret = f"{c.entry}_return" if c.category in (Category.NAME, Category.GRAPH_OP) else "cuda_call_return"
        assert c.entry and (c.ret is None or c.ret == want_ret)


def test_probe_rows_are_derived_one_per_symbol():
    assert len(CUDA_PROBES) == sum(len(c.symbols) for c in CALLS)
    assert {r.symbol for r in rows_for(DRIVER)} == {s for c in CALLS if c.library == DRIVER for s in c.symbols}
    assert set(rows_for(RUNTIME)) | set(rows_for(DRIVER)) | set(rows_for(NCCL)) >= set(CUDA_PROBES)


def test_c_defines_carry_every_id():
    text = c_defines()
    for c in CALLS:
        assert f"#define CALL_{c.const} {c.id}\n" in text
    assert f"#define CALL_MAX {max(BY_ID) + 1}\n" in text


def test_unknown_ids_are_named_not_fatal():
    assert call_name(9999) == "cuda_call_9999"
    assert records.CudaCall(1, 1, 0, 9999, 0).spec is None
