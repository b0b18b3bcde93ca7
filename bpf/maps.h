/* Maps and helpers shared by the HTTP and CUDA probes. Tunables arrive as -D cflags
 * from otel_gpu/probes/source.py, which also prepends the generated CALL_* ids. */
#ifndef OTEL_GPU_MAPS_H
#define OTEL_GPU_MAPS_H

#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include "events.h"

#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 2048
#endif
#ifndef MAX_PROCS
#define MAX_PROCS 4096
#endif
#ifndef MAX_CONNS
#define MAX_CONNS 65536
#endif
/* 1: every process that calls a CUDA probe is traced (no --pid/--exe filter). */
#ifndef TRACE_ALL
#define TRACE_ALL 1
#endif

BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

/* Processes being traced: tgid -> TRACED, or (user space, for a GPU process
 * related to HTTP servers: otel_gpu/pipeline/groups.py) the tgid of the one related
 * server whose HTTP activity also streams its CUDA calls, or FOLLOW_ALL (several
 * related servers: always streamed). Filled by user space (discovery, filters) and,
 * with TRACE_ALL, by the CUDA probes themselves (TRACED). */
BPF_HASH(traced, u32, u32, MAX_PROCS);
#define TRACED 1
#define FOLLOW_ALL 0xffffffffu

/* Processes with at least one server connection that carried an HTTP request:
 * tgid -> number of such connections. While non-zero, CUDA calls are streamed
 * so user space can attribute them; otherwise they are only counted. */
BPF_HASH(http_active, u32, s64, MAX_PROCS);

BPF_PERCPU_ARRAY(counters, u64, CNT_MAX);

static __always_inline void count(u32 idx)
{
    u64 *v = counters.lookup(&idx);
    if (v)
        (*v)++;
}

static __always_inline void fill_header(struct event_header *h, u8 kind, u64 pid_tgid)
{
    h->kind = kind;
    h->tgid = pid_tgid >> 32;
    h->tid = (u32)pid_tgid;
    h->ts_ns = bpf_ktime_get_ns();
}

static __always_inline int is_traced(u32 tgid)
{
    return traced.lookup(&tgid) != NULL;
}

static __always_inline void submit(void *data, u32 size)
{
    if (events.ringbuf_output(data, size, 0) != 0)
        count(CNT_RINGBUF_FULL);
}

#endif
