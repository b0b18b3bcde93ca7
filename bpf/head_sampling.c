/* Trace sampling decided as a request's head is read, so that an unsampled request's
 * CUDA calls are counted in req_agg from its first call, never streamed one by one,
 * whatever else its process has open (otel_gpu/pipeline/sampling.py kernel_bound).
 *
 * With a ratio sampler (traceidratio, parentbased_traceidratio; always_off and
 * parentbased_always_off as ratio 0), a root request's decision is its trace id's low
 * 64 bits against a bound: the kernel draws those bits at the request's first read
 * (http_probes.c emit_sock_io, on the record as `draw`), and user space makes them the
 * trace id of a request with no traceparent (pipeline/connections.py), so both decide
 * alike. The kernel decides only what it sees whole: the request's reads up to its head's
 * end, every byte of them copied, and no header line starting "tracepar" (a parent
 * decides: user space, and quiet_procs as before). Else the request is SAMPLE_NONE.
 *
 * The decision holds for the execution unit that read the head's end (its thread, or its
 * Go goroutine; with its Python context) while the connection's kernel-delimited request
 * lasts (until its next read after a write, or its close): call_out.c unit_sample. A
 * unit seen reading a second connection's head while the first's was unanswered (an
 * event loop's reader) never decides: its calls may serve either. */
#include "maps.h"

#define SAMPLE_NONE 0 /* not decided here */
#define SAMPLE_IN 1   /* sampled: its unit's calls stream even in a quiet process */
#define SAMPLE_OUT 2  /* not sampled: its unit's calls are counted only */
#define SAMPLE_PENDING 3 /* its head is not whole yet: its next reads are looked at too */

struct head_settings {
    u64 bound; /* a root is sampled when its draw < bound (TraceIdRatioBased's bound) */
    u32 on;    /* set by user space when its sampler is a ratio (kernel_io/program.py) */
    u32 pad;
};
BPF_ARRAY(head_settings, struct head_settings, 1);

/* The program that decides a head (http_syscalls.c head_scan), tail-called by the read
 * probes after a request's first read went out: a scan verified once, not in each. */
BPF_PROG_ARRAY(head_scans, 1);

struct unit_key {
    u64 id;   /* pid_tgid; a Go process: tgid << 32 (goroutines move between threads) */
    u64 unit; /* the execution unit (maps.h exec_unit): a Python context, a goroutine, 0 */
};
struct unit_head {
    u64 draw;   /* the draw of the request whose head the unit read last (conn_state.draw) */
    s32 fd;     /* its connection */
    u32 several;/* the unit read another head while one was unanswered: it never decides */
};
/* LRU: units end unannounced. */
BPF_TABLE("lru_hash", struct unit_key, struct unit_head, unit_heads, 16384);

static __always_inline struct unit_key unit_key_of(u32 tgid, u64 id, u64 unit)
{
    struct unit_key k = {.id = go_procs.lookup(&tgid) ? (u64)tgid << 32 : id, .unit = unit};
    return k;
}

/* A request's first read: its draw (never 0), or 0 when the kernel does not sample. */
static __always_inline u64 head_draw(void)
{
    u32 zero = 0;
    struct head_settings *set = head_settings.lookup(&zero);
    if (!set || !set->on)
        return 0;
    u64 r = (u64)bpf_get_prandom_u32() << 32 | bpf_get_prandom_u32();
    return r ? r : 1;
}

/* What a head's bytes so far tell, line by line: */
#define HEAD_MORE 0   /* no end yet: the next read of the request goes on (SAMPLE_PENDING) */
#define HEAD_ENDED 1  /* an empty line, and no line began "tracepar" */
#define HEAD_PARENT 2 /* a line began "tracepar" (any case) */
#define TRACEPAR 0x7261706563617274ull /* "tracepar", little-endian */

/* Does a line that starts with the 8 bytes `w` begin "tracepar", or is it empty ("\n",
 * "\r\n")? */
static __always_inline int parent_line(u64 w)
{
    return (w | 0x2020202020202020ull) == TRACEPAR;
}
static __always_inline u64 empty_line(u64 w)
{
    return (u64)((w & 0xff) == '\n') | (u64)((w & 0xffff) == 0x0a0d);
}

/* A read's bytes `d` (len, the whole read, zeros after it), which begin a line where
 * `line_start` (the request's last read ended one). Every line is looked at (pipelined
 * heads may follow an end). The loop comes first, from one path with few branches: the
 * verifier walks every iteration of it. */
static __always_inline u32 head_scan_read(const u8 *d, u32 len, u32 line_start)
{
    u64 w, ended = 0;
    for (u32 i = 0; i < HTTP_DATA_CAP; i++) {
        if (i >= len)
            break;
        if (d[i] != '\n')
            continue;
        __builtin_memcpy(&w, d + i + 1, sizeof(w));
        if (parent_line(w))
            return HEAD_PARENT;
        ended |= empty_line(w);
    }
    if (line_start) {
        __builtin_memcpy(&w, d, sizeof(w));
        if (parent_line(w))
            return HEAD_PARENT;
        ended |= empty_line(w);
    }
    return ended ? HEAD_ENDED : HEAD_MORE;
}
