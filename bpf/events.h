/* Every record otel-gpu's probes send to user space, and the map keys/values user
 * space reads. The first byte of each record is its kind. Fields are naturally
 * aligned with explicit padding (the layout test compiles this with -Wpadded and
 * checks every sizeof/offsetof against otel_gpu/pipeline/abi.py). The CUDA call
 * ids (CALL_*) are generated from otel_gpu/cuda_calls.py and prepended to the
 * program text: no enum here can drift from the table. */
#ifndef OTEL_GPU_EVENTS_H
#define OTEL_GPU_EVENTS_H

#ifndef OTEL_GPU_BPF /* set by the loader; absent for the layout test */
#include <stdint.h>
typedef uint8_t u8;
typedef uint16_t u16;
typedef uint32_t u32;
typedef int32_t s32;
typedef uint64_t u64;
typedef int64_t s64;
#endif

/* Bytes of a socket read/write copied for the HTTP parser (a power of two). */
#define HTTP_DATA_CAP 1024
/* Bytes copied from the end of a write: enough for a chunked terminator. */
#define HTTP_TAIL_CAP 8

enum event_kind {
    EV_ACCEPT = 1,      /* a traced process accepted a TCP connection */
    EV_SOCK_READ = 2,   /* bytes read from an accepted connection */
    EV_SOCK_WRITE = 3,  /* bytes written to an accepted connection */
    EV_SOCK_CLOSE = 4,  /* an accepted connection was closed */
    EV_CUDA_LAUNCH = 5, /* a kernel launch (CUDA calls are streamed while HTTP is active) */
    EV_PROC_EXIT = 6,   /* a traced process exited */
    EV_CUDA_MEMCPY = 7,
    EV_CUDA_MEMORY = 8, /* allocation or free */
    EV_CUDA_SYNC = 9,
    EV_CUDA_GRAPH = 10,
    EV_CUDA_DEVICE = 11,
    EV_PY_CONTEXT = 12, /* a traced Python process copied its contextvars.Context */
    EV_KERNEL_HANDLE = 13, /* a kernel handle was handed out: what it names */
    EV_NCCL = 16,       /* an NCCL collective or point-to-point call (nccl_probes.c) */
    EV_GRAPH_OP = 14,   /* CUDA graph capture begin/end, instantiate, destroy (graph_op_event) */
    EV_GO_SPAWN = 17,   /* a traced Go process started a goroutine (py_context_event: ctx new, parent its creator) */
    EV_GO_WAKE = 18,    /* a goroutine made another runnable (py_context_event: ctx the woken, parent the waker) */
    EV_GO_H2_UNIT = 19, /* a goroutine of Go's HTTP/2 server began a connection's frame reader or a stream's
                         * handler (go_h2_event) */
    EV_DEVICE_RECORDS = 20, /* GPU activity timed by the device: a batch from the device-clock library
                             * (device_records_event, bpf/device_records.c) */
    EV_LIBRARY_LOADED = 21, /* a process entered `loaded` (bpf/library_probes.c): a bare event_header */
};

/* The `loaded` value (bpf/library_probes.c): which of our libraries a process opened, by
 * name, since user space last looked (0: a probed library's initialiser ran, so it is mapped).
 * User space scans the process until it maps each (otel_gpu/collector.py). */
enum library_opened {
    LIB_CUDART = 1,
    LIB_DRIVER = 2,       /* libcuda.so */
    LIB_NCCL = 4,         /* libnccl.so, librccl.so */
    LIB_HIP = 8,          /* libamdhip64.so */
    LIB_DEVICE_CLOCK = 16, /* libotel_gpu_cupti.so */
    LIB_SSL = 32,         /* libssl.so, by a traced process */
};

/* event_header.flags bits. */
enum event_flag {
    /* A value the probe reads from the traced process's memory (a launch config, a
     * stack argument, cudaMalloc's *devPtr) could not be read: the fields that come
     * from it are 0, not real values. */
    EV_FLAG_UNREADABLE = 1,
    /* A socket read/write record whose bytes are TLS plaintext, read by the OpenSSL
     * probes (bpf/tls_probes.c) from SSL_read/SSL_write, not by the syscall probes. */
    EV_FLAG_TLS = 2,
    /* A launch made while its process had a stream capture open: streamed whatever the
     * HTTP state, so user space can tell a launch recorded into a graph (on the capturing
     * stream: it does not run) from one that runs (bpf/graph_probes.c). */
    EV_FLAG_CAPTURE = 4,
    /* A socket read that starts the connection's next HTTP/1 request as the kernel
     * delimits them (its first read, or a read after a write): where user space may
     * parse again after records of the connection were lost (`lost`). */
    EV_FLAG_REQ_START = 8,
    /* A CUDA call made while HTTP records of its process were lost and user space has not
     * yet heard so from their connections (http_seq.unseen): a request it cannot see may
     * own the call. In req_agg the same bit is AGG_HTTP_UNSEEN in the key's call. */
    EV_FLAG_HTTP_UNSEEN = 16,
    /* A socket read/write record of an HTTP/2 connection whose data is the kernel's frame
     * walk (bpf/h2_walk.c), not the transfer's first bytes: a digest. */
    EV_FLAG_H2_DIGEST = 32,
    /* A socket read/write record carrying its thread's time split so far (`times`,
     * bpf/thread_times.c): the thread was known to the sched probes. */
    EV_FLAG_TIMES = 64,
};

/* Where a thread's time went (bpf/thread_times.c), the index of each part in `times`. */
enum time_part {
    TIME_ON_CPU = 0,    /* running */
    TIME_CPU_WAIT = 1,  /* runnable, waiting for a CPU */
    TIME_GPU_SYNC = 2,  /* off the CPU inside a synchronising GPU call */
    TIME_BLOCKED = 3,   /* off the CPU for any other reason */
    TIME_PARTS = 4,
};

/* An HTTP/2 digest (sock_io_event.data with EV_FLAG_H2_DIGEST): what user space needs of
 * one transfer, in one or more records (all but the last with `more` set). Two bytes,
 * then pieces, each a u32 offset in the transfer and a u16 length (little-endian,
 * unaligned), then that many of the transfer's bytes: every frame header, and the
 * payloads that parsing needs (header blocks, SETTINGS, RST_STREAM, GOAWAY's first 8
 * bytes, the client preface); the bytes between pieces are other payloads. */
#define H2_DIGEST_CAP 4096   /* data bytes of one digest record */
#define H2_DIGEST_RECORDS 16 /* records of one transfer at most: past them, H2_STOP_ROOM */
#define H2_DIGEST_HEAD 2     /* data[0]: H2_STOP_*; data[1]: 1 when more records follow */
#define H2_PIECE_HEAD 6
/* Why the walk of a direction stopped for good (the digest's data[0]); user space drops
 * the connection, counting the cause. 0: it did not. */
#define H2_STOP_ROOM 1   /* a transfer needed more than H2_DIGEST_RECORDS records */
#define H2_STOP_STEPS 2  /* a transfer held more frames than the walk's steps */
#define H2_STOP_IOVS 3   /* a transfer's iovec array was longer than the walk reads */
#define H2_STOP_READ 4   /* the traced process's buffer could not be read */
#define AGG_HTTP_UNSEEN 0x80000000u

/* req_summaries value: the HTTP/1 requests of a process that the kernel summarised
 * because a record of theirs was lost (ring buffer full), by duration bucket: bucket i
 * holds durations in (bound i-1, bound i] (SUMMARY_BOUND_LIST: http.server.request.duration's
 * boundaries, set by otel_gpu/probes/summary_buckets.py; the last bucket is unbounded).
 * Counts and sums only grow: user space reads the differences. */
#ifndef SUMMARY_BOUNDS
#define SUMMARY_BOUNDS 1
#define SUMMARY_BOUND_LIST X(1000000000ull)
#endif
struct req_summary {
    u64 count[SUMMARY_BOUNDS + 1];
    u64 sum_ns[SUMMARY_BOUNDS + 1];
};

struct event_header {
    u8 kind;
    u8 flags;     /* enum event_flag bits */
    u8 pad[2];
    u32 tgid;     /* process id */
    u32 tid;      /* thread id */
    u32 epoch;    /* HTTP records, and the records that bind an execution unit (context
                   * copy, goroutine start or wake-up): the process's epoch after this
                   * record (maps.h http_seq); req_agg entries of older epochs go before
                   * it. 0 elsewhere */
    u64 ts_ns;    /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
};

struct accept_event {
    struct event_header h;
    s32 fd;           /* the accepted connection */
    s32 listen_fd;    /* the listening socket it came from */
    u16 family;       /* AF_INET / AF_INET6, 0 when the peer address was not asked for */
    u16 peer_port;    /* network byte order */
    u8 peer_addr[16]; /* IPv4 in the first 4 bytes */
    u32 flags;        /* ACCEPT_UNTRACKED: not in the connection table (full, or past the share) */
    u64 ino;          /* its socket's inode number (maps.h fd_ino) when tracked; 0: not known */
};
#define ACCEPT_UNTRACKED 1
#define ACCEPT_OVER_SHARE 2 /* with ACCEPT_UNTRACKED: the process held its share (conn_shares) */

struct sock_io_event {
    struct event_header h;
    s32 fd;
    u32 data_len;     /* bytes copied into data, <= HTTP_DATA_CAP */
    s64 ret;          /* bytes transferred by the syscall */
    u64 ctx;          /* Python context of the thread (struct py_context_event); 0: none */
    u32 tail_len;     /* bytes copied into tail (writes only) */
    u32 lost;         /* this connection's records lost just before this one (ring buffer full) */
    u64 draw;         /* a request's first read: the low 64 bits of a root request's trace id
                       * (bpf/head_sampling.c); 0: none */
    u64 times[TIME_PARTS]; /* with EV_FLAG_TIMES: the thread's time so far, ns by time_part */
    u8 tail[HTTP_TAIL_CAP];
    u8 data[HTTP_DATA_CAP]; /* only data_len bytes are sent */
};

struct close_event {
    struct event_header h;
    s32 fd;
    u32 lost;         /* as in sock_io_event */
    u64 ino;          /* its socket's inode number (conn_state.ino); 0: not known */
};

/* Every CUDA record: the shape follows the call's category (otel_gpu/cuda_calls.py). */
struct cuda_header {
    struct event_header h;
    u32 call;          /* CALL_* id */
    s32 ret;           /* return code; -1 when the probe has no return probe */
    u64 ctx;           /* Python context of the thread (struct py_context_event); 0: none */
};

struct launch_dims {
    u32 grid[3];
    u32 block[3];
};

struct launch_event {      /* EV_CUDA_LAUNCH */
    struct cuda_header c;
    u64 func;              /* kernel function pointer (runtime) or CUfunction/CUkernel */
    struct launch_dims dims;
    u64 shmem;             /* dynamic shared memory bytes */
    u64 stream;
};

struct memcpy_event {      /* EV_CUDA_MEMCPY */
    struct cuda_header c;
    u64 bytes;
    u64 stream;            /* 0 for synchronous copies */
    u32 direction;         /* cudaMemcpyKind */
    u32 pad;
};

struct memory_event {      /* EV_CUDA_MEMORY */
    struct cuda_header c;
    u64 ptr;               /* allocated (read at return) or freed pointer */
    u64 bytes;             /* allocation size; 0 for a free */
    u64 duration_ns;       /* entry to return; 0 without a return probe */
};

struct sync_event {        /* EV_CUDA_SYNC */
    struct cuda_header c;
    u64 handle;            /* stream or event; 0 for a device sync */
    u64 duration_ns;
};

struct graph_event {       /* EV_CUDA_GRAPH */
    struct cuda_header c;
    u64 graph_exec;
    u64 stream;
};

struct device_event {      /* EV_CUDA_DEVICE */
    struct cuda_header c;
    u32 device;            /* ordinal */
    u32 pad;
};

/* EV_NCCL: one NCCL collective or send/recv (bpf/nccl_probes.c). */
#define NCCL_NO_OP 0xffffffffu /* redop of a call without a reduction */
#define NCCL_NO_PEER (-1)      /* peer of a call without a root or peer */
struct nccl_event {
    struct cuda_header c;
    u64 count;             /* elements, as passed (all_gather: sendcount; reduce_scatter: recvcount) */
    u64 bytes;             /* what this rank receives (send: sends): count x datatype size;
                            * all_gather: sendcount x nranks (sendcount alone if nranks is unknown) */
    u64 comm;              /* ncclComm_t */
    u64 stream;
    u64 group;             /* the thread's outermost ncclGroupStart (its ktime), 0: no group */
    u32 datatype;          /* ncclDataType_t */
    u32 redop;             /* ncclRedOp_t, or NCCL_NO_OP */
    s32 peer;              /* root (broadcast, reduce) or peer (send, recv), or NCCL_NO_PEER */
    u32 nranks;            /* of the communicator, learnt at its init; 0: unknown */
    s32 rank;              /* this process's rank in it; -1: unknown */
    u32 pad;
};

/* nccl_comms key and value: a communicator learnt at the return of its init. */
struct nccl_comm_key {
    u32 tgid;
    u32 pad;
    u64 comm;
};
struct nccl_comm {
    u32 nranks;
    s32 rank;
};

/* EV_KERNEL_HANDLE, at the return of a call that hands out a kernel handle
 * (cuModuleGetFunction, cuLibraryGetKernel, cuKernelGetFunction, __cudaGetKernel,
 * ...): what a later launch of `handle` runs. Either a name (the mangled symbol the
 * caller asked for) or a source: the host stub or CUkernel the handle stands for.
 * Sent always (not only during requests): once per kernel, and launches name it later.
 * Variable length: only name_len bytes of name are sent. */
#define KERNEL_NAME_CAP 1024 /* a power of two; a longer name arrives cut (name_len == CAP - 1) */
struct kernel_handle_event {
    struct event_header h;
    u32 call;         /* CALL_* id of the call that handed the handle out */
    s32 ret;          /* its return code */
    u64 handle;       /* read from the out-parameter at return */
    u64 source;       /* host stub or CUkernel; 0 when a name follows */
    u32 name_len;     /* bytes in name, without the NUL; 0: none */
    u32 pad;
    char name[KERNEL_NAME_CAP];
};

/* EV_GRAPH_OP: a CUDA graph's life, always sent (rare calls). Which fields count
 * depends on the call: capture begin (stream), capture end (stream, graph read from
 * the out-parameter), instantiate (graph, exec read from the out-parameter), destroy
 * (graph or exec). ret is the call's return code; -1 without a return probe. */
struct graph_op_event {
    struct cuda_header c;
    u64 stream;
    u64 graph;
    u64 graph_exec;
};

/* The launch config in the traced process's memory, as both APIs lay it out:
 * cudaLaunchConfig_t {dim3 grid, block; size_t dynamicSmemBytes; stream; ...} and
 * CUlaunchConfig {u32 grid x,y,z, block x,y,z; u32 sharedMemBytes; (4 bytes of
 * padding) CUstream hStream; ...}. Shared memory at 24, the stream at 32 in both. */
struct user_launch_config {
    struct launch_dims dims;
    union {
        u64 dynamic_smem_bytes;  /* cudaLaunchConfig_t */
        u32 shared_mem_bytes;    /* CUlaunchConfig: the next 4 bytes are padding */
    };
    u64 stream;
};

/* EV_PY_CONTEXT, from PyContext_CopyCurrent's return (asyncio Task and Handle,
 * contextvars.copy_context()). A context is named by its address, which is its
 * CPython id(): the PyThreadState.context pointer of the thread running it.
 * EV_GO_SPAWN and EV_GO_WAKE too (bpf/go_probes.c), with GO_UNIT | goid for both. */
struct py_context_event {
    struct event_header h;
    u64 ctx;          /* the new copy */
    u64 parent;       /* the context running on the thread when it was copied; 0: unknown */
};

/* EV_GO_H2_UNIT (bpf/go_probes.c): goroutine `unit` began serverConn `conn`'s frame
 * reader (stream 0) or the handler of its stream `stream`. */
struct go_h2_event {
    struct event_header h;
    u64 unit;         /* GO_UNIT | goid */
    u64 conn;         /* the *serverConn: one per connection while it is served */
    u32 stream;       /* 0: the frame reader */
    u32 pad;
};

/* EV_DEVICE_RECORDS: what libotel_gpu_cupti.so handed to otel_gpu_device_records() in one call
 * (cupti/device_record.h: struct otel_gpu_device_record, mirrored field by field here). */
#define DEVICE_RECORDS_PER_CALL 16 /* cupti/device_record.h OTEL_GPU_RECORDS_PER_CALL */
struct device_record {
    u64 start_ns;       /* device start, CLOCK_MONOTONIC */
    u64 end_ns;
    u64 api_ns;         /* when the launching API call entered; 0: not known */
    u64 bytes;          /* memcpy/memset */
    u32 correlation_id;
    u32 tid;            /* the launching thread; 0: not known */
    u32 stream_id;
    u32 device_id;
    u8 kind;            /* 1 kernel, 2 memcpy, 3 memset */
    u8 copy_kind;
    u8 api_domain;      /* CUpti_CallbackDomain of the launching call */
    u8 pad1;
    u32 api_id;         /* its callback id */
    u8 pad[8];
};
struct device_records_event {
    struct event_header h;  /* tid: the library's thread that handed them over */
    u32 count;              /* valid records; more than DEVICE_RECORDS_PER_CALL arrive as that many */
    u32 pad;
    u64 dropped;            /* what the library says did not arrive intact since its last hand-off */
    struct device_record records[DEVICE_RECORDS_PER_CALL];
};

struct proc_exit_event {
    struct event_header h;
    char comm[16];    /* names a process that exited before /proc was read */
};

/* Per-process rollup of CUDA calls made while no HTTP request could be open:
 * counted in the kernel, read by user space periodically. */
struct rollup_key {
    u32 tgid;
    u32 call;
    u64 detail; /* by category, as otel_gpu/cuda_calls.py ROLLUP_DETAIL says: kernel function,
                 * graph exec, memcpy direction, pointer, device ordinal, or 0 */
};

struct rollup_value {
    u64 count;
    u64 bytes;
    u64 duration_ns;
};

/* launch_slots (bpf/launch_slots.c): one (process, kernel)'s launches on one CPU. */
struct launch_slot {
    u64 tgid; /* 0: free; SLOT_CLAIMING: being taken (64 bits: BPF's compare-and-swap) */
    u64 func;
    u64 count;
};
#define SLOT_CLAIMING (~0ULL)

/* req_agg: CUDA calls of a process with HTTP activity that were not streamed (past
 * the thread's per-request budget, or the ring buffer above its CUDA high-water mark),
 * counted by thread, HTTP epoch and Python context so that user space attributes them
 * exactly as it would the calls one by one, at the point of the epoch's end. */
struct agg_key {
    u32 tgid;
    u32 tid;
    u32 epoch;  /* the process's HTTP epoch when the calls were made */
    u32 call;
    u64 detail; /* as rollup_key.detail */
    u64 ctx;    /* Python context of the thread; 0: none */
};

struct agg_value {
    u64 count;
    u64 bytes;
    u64 duration_ns;
    u64 first_ts;    /* entry of the first call */
    u64 last_ts;     /* entry of the last call */
    u64 last_end_ts; /* latest return of a call with a duration, else its entry */
};

/* http_seq value, by tgid: bumped by the HTTP probes. */
struct http_seq {
    u32 epoch; /* +1 at every HTTP record the process sends (read, write, close) */
    u32 reads; /* +1 at every read of an HTTP connection: resets the threads' budgets */
    u32 unseen;/* its connections with records lost that no later record has told of yet */
    u32 pad;
};

/* py_procs value: a traced Python process's interpreter layout (otel_gpu/probes/python.py). */
struct py_proc {
    u64 main_interp;    /* the address of _PyRuntime.interpreters.main */
    u32 threads_head;   /* offsetof(PyInterpreterState, threads.head) */
    u32 thread_id;      /* offsetof(PyThreadState, thread_id) */
    u32 context_offset; /* offsetof(PyThreadState, context) */
    u32 pad;
};

/* py_threads key: a thread of a traced Python process, by its pthread_self() (its FS
 * base: what PyThreadState.thread_id holds). */
struct py_thread_key {
    u32 tgid;
    u32 pad;
    u64 thread;
};

/* go_procs value: where a traced Go process keeps its running goroutine
 * (otel_gpu/probes/go_runtime.py): TLS g at FS base + tls_g, then g.m.curg.goid. */
struct go_proc {
    s64 tls_g;        /* the TLS slot of g, from the FS base (negative) */
    u32 g_m;          /* offsetof(runtime.g, m) */
    u32 m_curg;       /* offsetof(runtime.m, curg) */
    u32 g_goid;       /* offsetof(runtime.g, goid) */
    u32 g_parent_goid; /* offsetof(runtime.g, parentGoid); 0: not in this Go */
};

/* A record's `ctx` names its execution unit: a Python context's address, or a
 * goroutine's id with this bit set (ids are small; addresses never have it). */
#define GO_UNIT (1ULL << 63)

/* Collector-side counters (array map indices). */
enum counter {
    CNT_RINGBUF_FULL = 0,   /* events lost because the ring buffer was full */
    CNT_CUDA_STREAMED = 1,  /* (calls counted in-kernel are in the rollup map itself) */
    CNT_DRIVER_DEDUPED = 2, /* driver launches already counted by the runtime */
    CNT_CONN_TABLE_FULL = 3, /* accepts of traced processes left untracked: table full */
    CNT_AGGREGATED = 4,     /* calls of active processes counted in req_agg, not streamed */
    CNT_AGG_FULL = 5,       /* calls lost: req_agg was full */
    CNT_DRIVER_CALLER_UNKNOWN = 6, /* driver launches counted before the process's runtime code was known */
    CNT_CAPTURE_LOST = 7,   /* launches on a capturing process lost: ring buffer full */
    CNT_TLS_CIPHERTEXT = 8, /* connections whose first bytes were a TLS record: ciphertext never sent */
    CNT_TLS_UNTIED = 9,     /* SSL_read/SSL_write plaintext dropped: no socket known for the SSL* */
    CNT_CONN_OVER_SHARE = 10, /* accepts of related servers left untracked: past their share */
    CNT_SCRATCH_BUSY = 11,  /* uprobe records dropped: every scratch slot of the CPU held (maps.h) */
    CNT_HEAD_DECIDED = 12,  /* request heads whose sampling the kernel decided (bpf/head_sampling.c) */
    CNT_HEAD_LEFT = 13,     /* request heads it left to user space: a traceparent, a head not whole */
    CNT_H2_UNWALKED = 14,   /* HTTP/2 connections whose frames the kernel could not walk: h2_walks full */
    CNT_ROLLUP_FULL = 15,   /* calls outside requests lost: the rollup table was full */
    CNT_THREAD_TIMES_FULL = 16, /* threads of traced processes whose time is not kept: thread_times full */
    CNT_DRIVER_AS_RUNTIME = 17, /* runtime launches counted at the driver: the runtime's probe was not attached */
    CNT_SWITCH_UNSEEN = 18, /* context switches of traced threads the sched program did not see (thread_times.c) */
    CNT_MAX = 19,
};

#endif
