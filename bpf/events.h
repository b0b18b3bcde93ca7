/* Every record otel-gpu's probes send to user space, and the map keys/values user
 * space reads. The first byte of each record is its kind. Fields are naturally
 * aligned with explicit padding (the layout test compiles this with -Wpadded and
 * checks every sizeof/offsetof against otel_gpu/pipeline/events.py). */
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
    EV_CUDA = 5,        /* one CUDA runtime/driver call (streamed while HTTP is active) */
    EV_PROC_EXIT = 6,   /* a traced process exited */
};

/* CUDA calls, shared by events and the per-process rollup map. */
enum cuda_call {
    CALL_LAUNCH_KERNEL = 1,
    CALL_LAUNCH_KERNEL_EXC = 2,
    CALL_MEMCPY = 3,
    CALL_MEMCPY_ASYNC = 4,
    CALL_MALLOC = 5,
    CALL_FREE = 6,
    CALL_STREAM_SYNC = 7,
    CALL_DEVICE_SYNC = 8,
    CALL_EVENT_SYNC = 9,
    CALL_GRAPH_LAUNCH = 10,
    CALL_CU_LAUNCH_KERNEL = 11,
    CALL_CU_LAUNCH_KERNEL_EX = 12,
    CALL_SET_DEVICE = 13,   /* bytes carries the device ordinal */
    CALL_MAX = 14,
};

struct event_header {
    u8 kind;
    u8 pad[3];
    u32 tgid;     /* process id */
    u32 tid;      /* thread id */
    u32 pad2;
    u64 ts_ns;    /* bpf_ktime_get_ns(): CLOCK_MONOTONIC */
};

struct accept_event {
    struct event_header h;
    s32 fd;           /* the accepted connection */
    s32 listen_fd;    /* the listening socket it came from */
    u16 family;       /* AF_INET / AF_INET6, 0 when the peer address was not asked for */
    u16 peer_port;    /* network byte order */
    u8 peer_addr[16]; /* IPv4 in the first 4 bytes */
    u32 pad;
};

struct sock_io_event {
    struct event_header h;
    s32 fd;
    u32 data_len;     /* bytes copied into data, <= HTTP_DATA_CAP */
    s64 ret;          /* bytes transferred by the syscall */
    u32 tail_len;     /* bytes copied into tail (writes only) */
    u32 pad;
    u8 tail[HTTP_TAIL_CAP];
    u8 data[HTTP_DATA_CAP]; /* only data_len bytes are sent */
};

struct close_event {
    struct event_header h;
    s32 fd;
    u32 pad;
};

struct cuda_event {
    struct event_header h;
    u32 call;          /* enum cuda_call */
    s32 ret;           /* return code; -1 when the probe has no return probe */
    u64 func;          /* kernel function pointer / handle, graph exec, freed pointer */
    u32 grid[3];
    u32 block[3];
    u64 shmem;
    u64 stream;
    u64 bytes;         /* memcpy count or allocation size */
    u32 kind;          /* memcpy direction (cudaMemcpyKind) */
    u32 pad;
    u64 duration_ns;   /* entry to return, for calls with a return probe */
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
    u64 func;   /* kernel function; for memcpy calls, the direction */
};

struct rollup_value {
    u64 count;
    u64 bytes;
    u64 duration_ns;
};

/* Collector-side counters (array map indices). */
enum counter {
    CNT_RINGBUF_FULL = 0,   /* events lost because the ring buffer was full */
    CNT_CUDA_STREAMED = 1,  /* (calls counted in-kernel are in the rollup map itself) */
    CNT_DRIVER_DEDUPED = 2, /* driver launches already counted by the runtime */
    CNT_CONN_TABLE_FULL = 3,
    CNT_MAX = 4,
};

#endif
