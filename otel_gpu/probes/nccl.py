"""What the codes in an NCCL record mean (nccl.h 2.32): the operation of each NCCL call
of cuda_calls.py, datatype names and sizes (bpf/nccl_probes.c nccl_type_size has the
same sizes; a unit test compares them), and reduction names. Every label is from these
fixed sets, so metrics stay bounded whatever a process passes."""
from __future__ import annotations

from typing import Optional

from ..cuda_calls import call_id

# Call -> the op a span and the metrics name it by.
OPS = {call_id("ncclAllReduce"): "all_reduce", call_id("ncclAllGather"): "all_gather",
       call_id("ncclReduceScatter"): "reduce_scatter", call_id("ncclBroadcast"): "broadcast",
       call_id("ncclReduce"): "reduce", call_id("ncclSend"): "send", call_id("ncclRecv"): "recv"}
# Ops whose peer field is a root, and those where it is the peer rank.
ROOTED = frozenset(call_id(n) for n in ("ncclBroadcast", "ncclReduce"))
POINT_TO_POINT = frozenset(call_id(n) for n in ("ncclSend", "ncclRecv"))

# ncclDataType_t -> (name, bytes per element)
DATATYPES = {0: ("int8", 1), 1: ("uint8", 1), 2: ("int32", 4), 3: ("uint32", 4), 4: ("int64", 8),
             5: ("uint64", 8), 6: ("float16", 2), 7: ("float32", 4), 8: ("float64", 8), 9: ("bfloat16", 2),
             10: ("float8e4m3", 1), 11: ("float8e5m2", 1)}
# ncclRedOp_t built-ins; 5 and up are user-made (ncclRedOpCreatePreMulSum).
REDOPS = {0: "sum", 1: "prod", 2: "max", 3: "min", 4: "avg"}


def op_name(call: int) -> str:
    return OPS.get(call, "other")


def datatype_name(code: int) -> str:
    known = DATATYPES.get(code)
    return known[0] if known else "unknown"


def redop_name(code: int) -> Optional[str]:
    """None for a call without a reduction (NCCL_NO_OP)."""
    if code == 0xFFFFFFFF:
        return None
    return REDOPS.get(code, "custom")
