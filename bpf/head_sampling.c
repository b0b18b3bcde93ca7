/* Trace sampling decided as a request's head is read, so that an unsampled request's
 * CUDA calls are counted in req_agg from its first call, never streamed one by one,
 * whatever else its process has open (otel_gpu/pipeline/sampling.py kernel_bound).
 *
 * With a ratio sampler (traceidratio, parentbased_traceidratio; always_off and
 * parentbased_always_off as ratio 0; parentbased_always_on as ratio 1, once user space
 * has seen an unsampled parent: a bound of ~0, which no draw reaches), a root request's
 * decision is its trace id's low 64 bits against a bound: the kernel draws those bits at
 * the request's first read (http_probes.c emit_sock_io, on the record as `draw`), and
 * user space makes them the trace id of a request with no traceparent
 * (pipeline/connections.py), so both decide alike. A request with a traceparent is
 * decided by its sampled flag (parentbased_*) or its trace id's low 64 bits
 * (traceidratio), read from the head (http_syscalls.c head_parent) where it is canonical
 * (version 00, lowercase) and alone. The kernel decides only what it sees whole: the
 * request's reads up to its head's end, every byte of them copied. Else the request is
 * SAMPLE_NONE: user space decides it, and while a process has no sampled request open
 * its calls are counted (quiet_procs).
 *
 * The decision holds for the execution unit that read the head's end (its thread, or its
 * Go goroutine; with its Python context) while the connection's kernel-delimited request
 * lasts (until its next read after a write, or its close): call_out.c unit_sample, and
 * for a Python context copied from that unit's (head_inherited). A unit seen reading a
 * second connection's head while the first's was unanswered (an event loop's reader)
 * never decides: its calls may serve either. */
#include "maps.h"

#define SAMPLE_NONE 0 /* not decided here */
#define SAMPLE_IN 1   /* sampled: its unit's calls stream even in a quiet process */
#define SAMPLE_OUT 2  /* not sampled: its unit's calls are counted only */
#define SAMPLE_PENDING 3 /* its head is not whole yet: its next reads are looked at too */

struct head_settings {
    u64 bound;   /* a root is sampled when its draw < bound (TraceIdRatioBased's bound) */
    u32 on;      /* set by user space when its sampler is a ratio (kernel_io/program.py) */
    u32 parents; /* parentbased_*: a parent's sampled flag decides; else its trace id's low
                  * 64 bits against the bound, as a root's draw */
};
BPF_ARRAY(head_settings, struct head_settings, 1);

/* The programs that decide a head (http_syscalls.c), tail-called: head_scan by the read
 * probes after a read of a request not decided yet (a scan verified once, not in each),
 * head_parent by head_scan for a head with a traceparent line. */
#define HEAD_SCAN 0
#define HEAD_PARENT_PARSE 1
BPF_PROG_ARRAY(head_scans, 2);

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

/* Per process where there is a unit (a goroutine moves between threads; a Python context
 * is one object of its process, which a worker thread may run), else per thread. */
static __always_inline struct unit_key unit_key_of(u32 tgid, u64 id, u64 unit)
{
    struct unit_key k = {.id = unit || go_procs.lookup(&tgid) ? (u64)tgid << 32 : id, .unit = unit};
    return k;
}

/* A Python context copied (python_probes.c py_copy_context_return) serves the head its
 * parent's unit read last: an asyncio server may make a request's task as it reads the
 * head (uvicorn: the task's context is a copy of the reading one), and a worker thread
 * may run a copy of its task's. So the kernel's decision for that head reaches the
 * calls made in the copy (call_out.c unit_sample), even where the reading unit, having
 * read other heads, decides nothing itself. A copy made for something else takes a
 * decision of fidelity only: user space attributes its calls all the same. */
static __always_inline void head_inherited(u32 tgid, u64 id, u64 parent, u64 copy)
{
    u32 zero = 0;
    struct head_settings *set = head_settings.lookup(&zero);
    if (!set || !set->on)
        return;
    struct unit_key from = unit_key_of(tgid, id, parent);
    struct unit_head *h = unit_heads.lookup(&from);
    if (!h)
        return;
    struct unit_head now = {.draw = h->draw, .fd = h->fd};
    struct unit_key to = unit_key_of(tgid, id, copy);
    unit_heads.update(&to, &now);
}

/* A request's first read: its draw (never 0 nor ~0), or 0 when the kernel does not sample. */
static __always_inline u64 head_draw(void)
{
    u32 zero = 0;
    struct head_settings *set = head_settings.lookup(&zero);
    if (!set || !set->on)
        return 0;
    u64 r = (u64)bpf_get_prandom_u32() << 32 | bpf_get_prandom_u32();
    return r && r != ~0ULL ? r : 1; /* below ~0: a bound of ~0 samples every root (ALL_ROOTS) */
}

/* What a head's bytes so far tell, line by line: */
#define HEAD_MORE 0   /* no end yet: the next read of the request goes on (SAMPLE_PENDING) */
#define HEAD_ENDED 1  /* an empty line, and no line began "tracepar" */
#define HEAD_PARENT 2 /* a line began "tracepar" (any case): head_parent reads it */
#define HEAD_UNSEEN 3 /* bytes not all copied, or not a request: left to user space */
#define HEAD_KIND 3           /* HEAD_PARENT's result also carries: */
#define HEAD_ENDED_BEFORE 4   /* an empty line came before the parent's line */
#define HEAD_AT_SHIFT 8       /* the parent's line's offset in the read */
#define TRACEPAR 0x7261706563617274ull /* "tracepar", little-endian */

/* Branchless helpers (a branch before or inside a loop doubles the verifier's walk of it).
 * is_eq: 1 when a == b; below_n: 1 when 0 <= x < n; hex_value: a lowercase hex digit's value,
 * or 16. */
static __always_inline u64 is_eq(u64 a, u64 b)
{
    return ((a ^ b) - 1) >> 63; /* a, b < 2^63 */
}
static __always_inline u64 below_n(s64 x, s64 n)
{
    return (u64)((x - n) & ~x) >> 63; /* 0 <= x < n */
}
static __always_inline u64 hex_value(u8 c)
{
    s64 d = (s64)c - '0', a = (s64)c - 'a';
    u64 is_d = below_n(d, 10), is_a = below_n(a, 6);
    return is_d * d + is_a * (a + 10) + (1 - (is_d | is_a)) * 16;
}

/* Does a line that starts with the 8 bytes `w` begin "tracepar", or is it empty ("\n",
 * "\r\n")? */
static __always_inline int parent_line(u64 w)
{
    return (w | 0x2020202020202020ull) == TRACEPAR;
}
static __always_inline u64 empty_line(u64 w)
{
    return is_eq(w & 0xff, '\n') | is_eq(w & 0xffff, 0x0a0d);
}

/* A read's bytes `d` (len, the whole read, zeros after it), which begin a line where
 * `line_start` (the request's last read ended one; the caller has looked for a parent
 * there). Lines are looked at up to the first "tracepar" one: HEAD_PARENT, with its
 * offset (<< HEAD_AT_SHIFT) and HEAD_ENDED_BEFORE where an empty line came before it
 * (pipelined heads). The loop comes first, from one path with few branches: the
 * verifier walks every iteration of it. */
static __always_inline u32 head_scan_read(const u8 *d, u32 len, u32 line_start)
{
    u64 w, ended = 0;
    for (u32 i = 0; i < HTTP_DATA_CAP; i++) {
        asm volatile("" : "+r"(len)); /* else clang exits on i == len, which bounds i for no verifier */
        if (i >= len)
            break;
        if (d[i] != '\n')
            continue;
        __builtin_memcpy(&w, d + i + 1, sizeof(w));
        if (parent_line(w))
            return HEAD_PARENT | (u32)ended * HEAD_ENDED_BEFORE | (i + 1) << HEAD_AT_SHIFT;
        ended |= empty_line(w);
    }
    if (line_start) {
        __builtin_memcpy(&w, d, sizeof(w));
        ended |= empty_line(w);
    }
    return ended ? HEAD_ENDED : HEAD_MORE;
}

/* After a parent's line, from `from` on: does the head end in `d` (len bytes, zeros
 * after), with no other "tracepar" line? */
static __always_inline int ends_without_parent(const u8 *d, u32 len, u32 from)
{
    u64 w, ended = 0;
    __builtin_memcpy(&w, d + from, sizeof(w));
    if (parent_line(w))
        return 0;
    ended = empty_line(w); /* an empty line right after the parent's */
    for (u32 i = 0; i < HTTP_DATA_CAP; i++) {
        u32 j = from + i;
        asm volatile("" : "+r"(len)); /* as in head_scan_read */
        if (j >= len || j >= HTTP_DATA_CAP)
            break;
        if (d[j] != '\n')
            continue;
        __builtin_memcpy(&w, d + j + 1, sizeof(w));
        if (parent_line(w))
            return 0;
        ended |= empty_line(w);
    }
    return ended != 0;
}

/* The sampling a head with a "tracepar" line at `at` in `d` (len bytes, zeros after)
 * decides: only "traceparent:", at most one space, version 00 in its canonical form
 * ("00-" 32 hex "-" 16 hex "-" 2 hex, lowercase, ids not 0), the line's end, and the
 * head's end after it with no other such line. Anything else is SAMPLE_NONE: the
 * collector's parser (pipeline/traceparent.py) is the reference, and this accepts a
 * subset of what it accepts. `parents`: the flag decides (parentbased_*), else the
 * trace id's low 64 bits against `bound`. The layout is found without branches, the
 * head's end is looked for, and only then is the value read. */
static __always_inline u32 parent_sample(const u8 *d, u32 len, u32 at, u32 parents, u64 bound)
{
    u32 name;
    __builtin_memcpy(&name, d + at + 8, sizeof(name));
    if ((name | 0x00202020) != 0x3a746e65) /* "ent:" in any case */
        return SAMPLE_NONE;
    u32 v = at + 12 + (u32)is_eq(d[at + 12], ' ');
    const u8 *p = d + v;
    u32 end = v + 56 + (u32)is_eq(p[55], '\r');
    if (end + 1 > len || !ends_without_parent(d, len, end))
        return SAMPLE_NONE;
    u64 low = 0, high = 0, span = 0, bad = 0;
    for (int k = 0; k < 16; k++) {
        u64 h = hex_value(p[3 + k]), l = hex_value(p[19 + k]), s = hex_value(p[36 + k]);
        bad |= (h | l | s) & 16;
        high = high << 4 | (h & 15);
        low = low << 4 | (l & 15);
        span = span << 4 | (s & 15);
    }
    u64 f0 = hex_value(p[53]), f1 = hex_value(p[54]);
    bad |= (f0 | f1) & 16;
    bad |= !is_eq(p[0], '0') | !is_eq(p[1], '0') | !is_eq(p[2], '-') | !is_eq(p[35], '-') | !is_eq(p[52], '-');
    bad |= !is_eq(d[end - 1], '\n'); /* "\n", or "\r\n" where end counted the "\r" */
    if (bad || !(high | low) || !span)
        return SAMPLE_NONE;
    if (parents)
        return f1 & 1 ? SAMPLE_IN : SAMPLE_OUT;
    return low < bound ? SAMPLE_IN : SAMPLE_OUT;
}
