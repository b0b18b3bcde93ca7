"""The ctypes mirror of bpf/events.h: the records the probes send and the map keys
and values user space reads. tests/unit/test_event_layout.py compiles the header
with -Wpadded and checks every size, offset and constant here against it. The CUDA
call ids are not here: they live in cuda_calls.py (the BPF side gets them as
generated #defines)."""
from __future__ import annotations

import ctypes as ct
import struct

HTTP_DATA_CAP = 1024
H2_DIGEST_CAP = 4096  # data bytes of an HTTP/2 digest record (EV_FLAG_H2_DIGEST)
H2_DIGEST_RECORDS = 16
H2_DIGEST_HEAD = 2  # data[0]: H2_STOP_*, data[1]: more records of the transfer follow
H2_PIECE_HEAD = 6  # u32 offset, u16 length
H2_STOP_ROOM, H2_STOP_STEPS, H2_STOP_IOVS, H2_STOP_READ = 1, 2, 3, 4
HTTP_TAIL_CAP = 8
KERNEL_NAME_CAP = 1024

# enum event_kind: the first byte of every record
EV_ACCEPT = 1
EV_SOCK_READ = 2
EV_SOCK_WRITE = 3
EV_SOCK_CLOSE = 4
EV_CUDA_LAUNCH = 5
EV_PROC_EXIT = 6
EV_CUDA_MEMCPY = 7
EV_CUDA_MEMORY = 8
EV_CUDA_SYNC = 9
EV_CUDA_GRAPH = 10
EV_CUDA_DEVICE = 11
EV_PY_CONTEXT = 12
EV_KERNEL_HANDLE = 13
EV_GRAPH_OP = 14
EV_NCCL = 16
EV_GO_SPAWN = 17
EV_GO_WAKE = 18
EV_GO_H2_UNIT = 19
EV_DEVICE_RECORDS = 20
EV_LIBRARY_LOADED = 21  # a bare event_header: user space reads the `loaded` table now

# enum library_opened: the `loaded` table's value, which of our libraries a process opened
LIB_CUDART = 1
LIB_DRIVER = 2
LIB_NCCL = 4
LIB_HIP = 8
LIB_DEVICE_CLOCK = 16
LIB_SSL = 32
DEVICE_RECORDS_PER_CALL = 16
GO_UNIT = 1 << 63  # a record's ctx names a goroutine (GO_UNIT | goid), not a Python context

# enum event_flag: bits of event_header.flags
EV_FLAG_UNREADABLE = 1  # a value read from the traced process's memory failed: its fields are 0
EV_FLAG_TLS = 2  # a socket read/write record of TLS plaintext (bpf/tls_probes.c)
EV_FLAG_CAPTURE = 4  # a launch of a process with a stream capture open (recorded into a graph, or run)
EV_FLAG_REQ_START = 8  # a socket read that starts an HTTP/1 request as the kernel delimits them
EV_FLAG_HTTP_UNSEEN = 16  # a CUDA call made while HTTP records of its process went unseen (lost)
EV_FLAG_H2_DIGEST = 32  # a socket record whose data is the kernel's HTTP/2 frame walk (bpf/h2_walk.c)
EV_FLAG_TIMES = 64  # a socket record carrying its thread's time split so far (bpf/thread_times.c)
TIME_PARTS = 4  # bpf/events.h enum time_part: on CPU, waiting for a CPU, in a GPU sync, blocked
AGG_HTTP_UNSEEN = 0x80000000  # the same, in a req_agg key's call

# enum counter: indices of the per-CPU `counters` array
CNT_RINGBUF_FULL = 0
CNT_CUDA_STREAMED = 1
CNT_DRIVER_DEDUPED = 2
CNT_CONN_TABLE_FULL = 3
CNT_AGGREGATED = 4
CNT_AGG_FULL = 5
CNT_DRIVER_CALLER_UNKNOWN = 6
CNT_CAPTURE_LOST = 7
CNT_TLS_CIPHERTEXT = 8
CNT_TLS_UNTIED = 9
CNT_CONN_OVER_SHARE = 10
CNT_SCRATCH_BUSY = 11
CNT_HEAD_DECIDED = 12
CNT_HEAD_LEFT = 13
CNT_H2_UNWALKED = 14
CNT_ROLLUP_FULL = 15
CNT_THREAD_TIMES_FULL = 16
CNT_DRIVER_AS_RUNTIME = 17
CNT_SWITCH_UNSEEN = 18
ACCEPT_UNTRACKED = 1  # accept_event.flags: not in the connection table (full, or past the share)
ACCEPT_OVER_SHARE = 2  # with ACCEPT_UNTRACKED: the process held its share (conn_shares)

COUNTER_NAMES = ("ringbuf_full", "cuda_streamed", "driver_deduped", "conn_table_full", "aggregated",
                 "agg_full", "driver_caller_unknown", "capture_lost", "tls_ciphertext", "tls_untied",
                 "conn_over_share", "scratch_busy", "head_decided", "head_left", "h2_unwalked",
                 "rollup_full", "thread_times_full", "driver_as_runtime", "switch_unseen")

u8, u16, u32, s32, u64, s64 = ct.c_uint8, ct.c_uint16, ct.c_uint32, ct.c_int32, ct.c_uint64, ct.c_int64


class EventHeader(ct.Structure):
    _fields_ = [("kind", u8), ("flags", u8), ("pad", u8 * 2), ("tgid", u32), ("tid", u32), ("epoch", u32),
                ("ts_ns", u64)]


class AcceptEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("fd", s32), ("listen_fd", s32), ("family", u16),
                ("peer_port", u16), ("peer_addr", u8 * 16), ("flags", u32), ("ino", u64)]


class SockIoEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("fd", s32), ("data_len", u32), ("ret", s64), ("ctx", u64),
                ("tail_len", u32), ("lost", u32), ("draw", u64), ("times", u64 * TIME_PARTS),
                ("tail", u8 * HTTP_TAIL_CAP),
                ("data", u8 * HTTP_DATA_CAP)]


class CloseEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("fd", s32), ("lost", u32), ("ino", u64)]


class PyContextEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("ctx", u64), ("parent", u64)]


class GoH2Event(ct.Structure):
    _fields_ = [("h", EventHeader), ("unit", u64), ("conn", u64), ("stream", u32), ("pad", u32)]


class KernelHandleEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("call", u32), ("ret", s32), ("handle", u64), ("source", u64),
                ("name_len", u32), ("pad", u32), ("name", ct.c_char * KERNEL_NAME_CAP)]


class DeviceRecord(ct.Structure):
    """One record of libotel_gpu_cupti.so (cupti/device_record.h)."""
    _fields_ = [("start_ns", u64), ("end_ns", u64), ("api_ns", u64), ("bytes", u64), ("correlation_id", u32),
                ("tid", u32), ("stream_id", u32), ("device_id", u32), ("kind", ct.c_uint8), ("copy_kind", ct.c_uint8),
                ("api_domain", ct.c_uint8), ("pad1", ct.c_uint8), ("api_id", u32), ("pad", ct.c_uint8 * 8)]


class DeviceRecordsEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("count", u32), ("pad", u32), ("dropped", u64),
                ("records", DeviceRecord * DEVICE_RECORDS_PER_CALL)]


class ProcExitEvent(ct.Structure):
    _fields_ = [("h", EventHeader), ("comm", ct.c_char * 16)]


# --- CUDA records: one shape per call category (cuda_calls.py Shape) -----------
class CudaHeader(ct.Structure):
    _fields_ = [("h", EventHeader), ("call", u32), ("ret", s32), ("ctx", u64)]


class LaunchDims(ct.Structure):
    _fields_ = [("grid", u32 * 3), ("block", u32 * 3)]


class LaunchEvent(ct.Structure):
    _fields_ = [("c", CudaHeader), ("func", u64), ("dims", LaunchDims), ("shmem", u64),
                ("stream", u64)]


class MemcpyEvent(ct.Structure):
    _fields_ = [("c", CudaHeader), ("bytes", u64), ("stream", u64), ("direction", u32),
                ("pad", u32)]


class MemoryEvent(ct.Structure):
    _fields_ = [("c", CudaHeader), ("ptr", u64), ("bytes", u64), ("duration_ns", u64)]


class SyncEvent(ct.Structure):
    _fields_ = [("c", CudaHeader), ("handle", u64), ("duration_ns", u64)]


class GraphEvent(ct.Structure):
    _fields_ = [("c", CudaHeader), ("graph_exec", u64), ("stream", u64)]


class DeviceEvent(ct.Structure):
    _fields_ = [("c", CudaHeader), ("device", u32), ("pad", u32)]


class GraphOpEvent(ct.Structure):
    _fields_ = [("c", CudaHeader), ("stream", u64), ("graph", u64), ("graph_exec", u64)]


NCCL_NO_OP = 0xFFFFFFFF  # nccl_event.redop of a call without a reduction
NCCL_NO_PEER = -1        # nccl_event.peer of a call without a root or peer


class NcclEvent(ct.Structure):
    _fields_ = [("c", CudaHeader), ("count", u64), ("bytes", u64), ("comm", u64), ("stream", u64),
                ("group", u64), ("datatype", u32), ("redop", u32), ("peer", s32), ("nranks", u32),
                ("rank", s32), ("pad", u32)]


class NcclCommKey(ct.Structure):
    _fields_ = [("tgid", u32), ("pad", u32), ("comm", u64)]


class NcclComm(ct.Structure):
    _fields_ = [("nranks", u32), ("rank", s32)]


class _SmemBytes(ct.Union):
    _fields_ = [("dynamic_smem_bytes", u64), ("shared_mem_bytes", u32)]


class UserLaunchConfig(ct.Structure):
    """cudaLaunchConfig_t / CUlaunchConfig as the probes read them (not a record)."""
    _anonymous_ = ("smem",)
    _fields_ = [("dims", LaunchDims), ("smem", _SmemBytes), ("stream", u64)]


# --- maps ---------------------------------------------------------------------------
class PyProc(ct.Structure):
    """py_procs value: where the interpreter keeps its threads' states (probes/python.py)."""
    _fields_ = [("main_interp", u64), ("threads_head", u32), ("thread_id", u32), ("context_offset", u32),
                ("pad", u32)]

    @classmethod
    def of(cls, found) -> "PyProc":
        """From a probes/python.PythonProcess."""
        lay = found.layout
        return cls(main_interp=found.main_interp, threads_head=lay.threads_head, thread_id=lay.thread_id,
                   context_offset=lay.context)


class PyThreadKey(ct.Structure):
    """py_threads key: a traced Python process's thread, by its pthread_self()."""
    _fields_ = [("tgid", u32), ("pad", u32), ("thread", u64)]


class GoProc(ct.Structure):
    """go_procs value: where a Go process keeps its running goroutine (probes/go_runtime.py)."""
    _fields_ = [("tls_g", s64), ("g_m", u32), ("m_curg", u32), ("g_goid", u32), ("g_parent_goid", u32)]


class RollupKey(ct.Structure):
    _fields_ = [("tgid", u32), ("call", u32), ("detail", u64)]


class RollupValue(ct.Structure):
    _fields_ = [("count", u64), ("bytes", u64), ("duration_ns", u64)]


class LaunchSlot(ct.Structure):
    """launch_slots entry (bpf/launch_slots.c): tgid 0 is a free slot, SLOT_CLAIMING one
    being taken."""
    _fields_ = [("tgid", u64), ("func", u64), ("count", u64)]


SLOT_CLAIMING = (1 << 64) - 1


class AggKey(ct.Structure):
    _fields_ = [("tgid", u32), ("tid", u32), ("epoch", u32), ("call", u32), ("detail", u64), ("ctx", u64)]


class AggValue(ct.Structure):
    _fields_ = [("count", u64), ("bytes", u64), ("duration_ns", u64), ("first_ts", u64), ("last_ts", u64),
                ("last_end_ts", u64)]


def layout(ctype) -> struct.Struct:
    """The `struct` layout of a mirror made of integer fields (a ctypes integer's `_type_`
    is its struct code), as ctypes lays it out: for rows read as bytes (req_agg)."""
    codes = "".join(t._type_ for _name, t in ctype._fields_)
    s = struct.Struct("@" + codes)
    if s.size != ct.sizeof(ctype):
        raise TypeError(f"{ctype.__name__}: its struct layout is not its ctypes one")
    return s


class HttpSeq(ct.Structure):
    _fields_ = [("epoch", u32), ("reads", u32), ("unseen", u32), ("pad", u32)]


# C struct name -> mirror (the layout test walks this).
STRUCTS: dict[str, type] = {
    "event_header": EventHeader, "accept_event": AcceptEvent, "sock_io_event": SockIoEvent,
    "close_event": CloseEvent, "py_context_event": PyContextEvent, "go_h2_event": GoH2Event,
    "kernel_handle_event": KernelHandleEvent, "proc_exit_event": ProcExitEvent,
    "device_record": DeviceRecord, "device_records_event": DeviceRecordsEvent,
    "cuda_header": CudaHeader, "launch_dims": LaunchDims, "launch_event": LaunchEvent,
    "memcpy_event": MemcpyEvent, "memory_event": MemoryEvent, "sync_event": SyncEvent,
    "graph_event": GraphEvent, "device_event": DeviceEvent, "graph_op_event": GraphOpEvent, "nccl_event": NcclEvent,
    "nccl_comm_key": NcclCommKey, "nccl_comm": NcclComm, "user_launch_config": UserLaunchConfig,
    "py_proc": PyProc, "py_thread_key": PyThreadKey, "go_proc": GoProc, "rollup_key": RollupKey, "rollup_value": RollupValue, "launch_slot": LaunchSlot,
    "agg_key": AggKey, "agg_value": AggValue, "http_seq": HttpSeq,
}
