/* The way out for a traced CUDA call (every probe file's handlers end here): while its
 * process, or the related server it follows (maps.h `traced`), has HTTP activity, the
 * call is streamed to user space as a record (one typed record per category,
 * bpf/events.h) within its thread's per-request budget and the host-wide stream rate,
 * and past them counted per request in `req_agg`; otherwise it is only counted in
 * `rollup` (or, for a launch on the fast path, in its launch slot: bpf/launch_slots.c).
 * Every handler carries the process's `traced` value from its one lookup (tv) to the
 * streaming decision. */
#include "maps.h"

#ifndef CALL_MAX
#error "CALL_* ids missing: compose the program with otel_gpu.probes.source.source_text()"
#endif

/* One entry per (process, call, detail) for all CPUs, made when first counted (maps.h
 * BY_NEED), added to atomically. Per CPU, preallocated, it held 65536 x 24 B for every
 * CPU: 358 MB on a 224-CPU node, for a few hundred keys a process; the launch fast path
 * (launch_slots.c) keeps its per-CPU counts where the adds are hottest. */
BPF_F_TABLE("hash", struct rollup_key, struct rollup_value, rollup, 65536, BY_NEED);

/* The process's traced value (maps.h), 0 when it is not traced. */
static __always_inline u32 cuda_admit(u32 tgid)
{
#if TRACE_ALL
    u32 one = TRACED;
    u32 *tv = traced.lookup_or_try_init(&tgid, &one);
    pid_mark(tgid, PID_TRACED);
    return tv ? *tv : TRACED;
#else
    u32 *tv = traced.lookup(&tgid);
    return tv ? *tv : 0;
#endif
}

/* A process that follows no server (tv == TRACED) pays one lookup, as before
 * following existed; a follower first looks at its server's activity. */
static __always_inline int streaming(u32 tgid, u32 tv)
{
    s64 *active;
    if (tv != TRACED) {
        if (tv == FOLLOW_ALL)
            return 1;
        active = http_active.lookup(&tv);
        if (active && *active > 0)
            return 1;
    }
    active = http_active.lookup(&tgid);
    return active && *active > 0;
}

/* Atomic: threads on other CPUs add to the same entry, and a uprobe program can be
 * preempted mid-add (maps.h scratch_claim). A first add that finds the entry made
 * meanwhile adds to it instead; one that finds the table full counts CNT_ROLLUP_FULL. */
static __always_inline void rollup_add(u32 tgid, u32 call, u64 detail, u64 bytes, u64 duration_ns)
{
    struct rollup_key k = {.tgid = tgid, .call = call, .detail = detail};
    struct rollup_value *v = rollup.lookup(&k);
    if (!v) {
        struct rollup_value nv = {.count = 1, .bytes = bytes, .duration_ns = duration_ns};
        if (rollup.insert(&k, &nv) == 0)
            return;
        v = rollup.lookup(&k);
        if (!v) {
            count(CNT_ROLLUP_FULL);
            return;
        }
    }
    __sync_fetch_and_add(&v->count, 1);
    if (bytes) /* none for a launch */
        __sync_fetch_and_add(&v->bytes, bytes);
    if (duration_ns)
        __sync_fetch_and_add(&v->duration_ns, duration_ns);
}

/* Per thread and Python context (an asyncio task: one request; 0 outside Python): calls
 * streamed since the process's last HTTP read (`reads` as http_seq had it then). LRU: a
 * thread or context that is gone must not hold an entry. */
struct budget_key {
    u64 pid_tgid;
    u64 ctx;
};
struct thread_budget {
    u32 reads;
    u32 streamed;
};
BPF_TABLE("lru_hash", struct budget_key, struct thread_budget, stream_budget, 16384);

/* How many calls go out one by one, written by user space once the program is loaded
 * (probes/source.py write_stream_settings): in a map, not -D flags, so that another
 * --stream-rate or --stream-budget is the same program (from the cache, no compile).
 * All zero until written: nothing streams, every call is counted. */
struct stream_settings {
    u64 rate_per_cpu;  /* calls a second on each CPU (user space splits --stream-rate) */
    u64 high_water;    /* unread ring buffer bytes past which nothing streams (the collector
                        * is behind): the rest is kept for HTTP records, never aggregated */
    u32 budget;        /* calls per thread and request (reset at each HTTP read of the process) */
    u32 _pad;
};
BPF_ARRAY(stream_settings, struct stream_settings, 1);

/* Host-wide bound on calls streamed one by one: rate_per_cpu a second on each CPU, in
 * bursts of up to one second's share (a short burst of requests, e.g. one busy event-loop
 * CPU, keeps its one-by-one calls; the ring buffer holds a burst easily: 2 CPUs x 2500
 * records). Past it calls are counted in req_agg, so the consumer's load follows this
 * rate and not requests/s x budget: unbounded, its backlog filled the ring and pushed
 * HTTP records out (requests never ended). */
#define NS_PER_S 1000000000ull
struct stream_tokens {
    u64 last_ns;
    u64 tokens;  /* in 1e-9 calls */
};
BPF_PERCPU_ARRAY(stream_rate, struct stream_tokens, 1);

static __always_inline int stream_token(u64 rate)
{
    u32 zero = 0;
    struct stream_tokens *t = stream_rate.lookup(&zero);
    if (!t)
        return 0;
    u64 now = bpf_ktime_get_ns();
    u64 dt = now - t->last_ns;
    if (dt > NS_PER_S)
        dt = NS_PER_S;
    u64 cap = (rate + 1) * NS_PER_S;
    u64 tokens = t->tokens + dt * rate;
    t->last_ns = now;
    if (tokens > cap)
        tokens = cap;
    if (tokens < NS_PER_S) {
        t->tokens = tokens;
        return 0;
    }
    t->tokens = tokens - NS_PER_S;
    return 1;
}

/* What becomes of a call of a streaming process. */
enum stream_verdict {
    COUNT_NOW,    /* counted in req_agg: the ring buffer or the stream rate is short now */
    COUNT_UNTIL,  /* counted, and so are the thread's next calls until the basis changes
                   * (request_counts.c): its budget is spent, or its process is quiet */
    STREAM,       /* goes out one by one */
};

/* The sampling the kernel decided for the request whose head the calling unit read
 * (head_sampling.c), while that request lasts; SAMPLE_NONE where it decided none. */
static __always_inline u32 unit_sample(u32 tgid, u64 id, u64 unit)
{
    u32 zero = 0;
    struct head_settings *set = head_settings.lookup(&zero);
    if (!set || !set->on)
        return SAMPLE_NONE;
    struct unit_key k = unit_key_of(tgid, id, unit);
    struct unit_head *h = unit_heads.lookup(&k);
    if (!h || h->several)
        return SAMPLE_NONE;
    struct conn_key ck = {.tgid = tgid, .fd = h->fd};
    struct conn_state *st = conns.lookup(&ck);
    return st && st->draw == h->draw && st->sample != SAMPLE_PENDING ? st->sample : SAMPLE_NONE;
}

/* A follower (tv != TRACED) streams while it has no HTTP activity of its own: its calls
 * then belong to another process's requests, whose epochs are not its own. `reads`:
 * the process's HTTP reads as the basis has them. */
static __always_inline enum stream_verdict stream_this(u64 id, u64 ctx, u32 tgid, u32 tv, struct http_seq *s,
                                                      u32 reads)
{
    if (tv != TRACED) {
        s64 *own = http_active.lookup(&tgid);
        if (!s || !own || *own <= 0)
            return STREAM;
    }
    u32 sample = unit_sample(tgid, id, ctx);
    if (sample == SAMPLE_OUT)
        return COUNT_UNTIL; /* its request is not sampled: counted, its summary exact all the same */
    u8 *quiet = sample == SAMPLE_NONE ? quiet_procs.lookup(&tgid) : 0;
    if (quiet && *quiet)
        return COUNT_UNTIL; /* no sampled request open: counted, its summaries exact all the same */
    u32 zero = 0;
    struct stream_settings *set = stream_settings.lookup(&zero);
    if (!set)
        return COUNT_NOW;
    struct budget_key key = {.pid_tgid = id, .ctx = ctx};
    struct thread_budget *b = stream_budget.lookup(&key);
    int mine = b && b->reads == reads;
    if (mine && b->streamed >= set->budget)
        return COUNT_UNTIL;
    if (ring_unread() >= set->high_water)
        return COUNT_NOW; /* the rest of the ring is kept for HTTP records */
    if (!stream_token(set->rate_per_cpu))
        return COUNT_NOW;
    if (mine) {
        b->streamed++;
    } else {
        struct thread_budget nb = {.reads = reads, .streamed = 1};
        stream_budget.update(&key, &nb);
    }
    return STREAM;
}

/* A call of a streaming process, its header filled: 1 when it goes out one by one (the
 * caller fills the rest of its record, then stream_out), 0 when it was counted in req_agg
 * here, so that a call past its budget reads nothing more of the target's memory. */
static __always_inline int stream_admit(struct cuda_header *c, u32 tv, struct http_seq **sp, u64 detail,
                                        u64 bytes, u64 duration_ns)
{
    u32 tgid = c->h.tgid;
    u64 id = (u64)tgid << 32 | c->h.tid;
    struct http_seq *s = http_seq.lookup(&tgid);
    struct verdict_basis basis = verdict_basis_now(tgid, s);
    *sp = s;
    if (s && s->unseen)
        c->h.flags |= EV_FLAG_HTTP_UNSEEN;
    c->ctx = exec_unit(tgid, c->h.tid);
    enum stream_verdict verdict = stream_this(id, c->ctx, tgid, tv, s, basis.reads);
    if (verdict == STREAM)
        return 1;
    if (verdict == COUNT_UNTIL && s && tv == TRACED)
        remember_counted(tgid, id, c->ctx, basis);
    agg_add(c, s ? s->epoch : 0, detail, bytes, duration_ns);
    return 0;
}

/* The record of a call stream_admit let through; a full ring buffer counts it in req_agg
 * (or, with no epoch of its own to count it by, as lost). */
static __always_inline void stream_out(struct cuda_header *c, u32 size, struct http_seq *s, u64 detail,
                                       u64 bytes, u64 duration_ns)
{
    if (events.ringbuf_output(c, size, 0) == 0) {
        count(CNT_CUDA_STREAMED);
        return;
    }
    if (!s) {
        count(CNT_RINGBUF_FULL);
        return;
    }
    agg_add(c, s->epoch, detail, bytes, duration_ns);
}

/* The one way out for a CUDA call: while its process streams, the whole record within
 * the budget (or, past it or with the ring buffer full, a count in req_agg); else its
 * rollup (detail as otel_gpu/cuda_calls.py ROLLUP_DETAIL says for the category). */
static __always_inline void cuda_emit(struct cuda_header *c, u32 size, u32 tv, u64 detail, u64 bytes,
                                      u64 duration_ns)
{
    if (c->h.kind == EV_CUDA_LAUNCH && capturing(c->h.tgid)) {
        capture_emit(c, size);  /* recorded into a graph, or run: user space decides */
        return;
    }
    if (tv == TRACED && (pid_flags(c->h.tgid) & PID_SLOW)) {
        u64 id = (u64)c->h.tgid << 32 | c->h.tid;
        struct verdict_held held;
        if (standing_verdict(c->h.tgid, id, &held)) {
            counted_add(c, &held, detail, bytes, duration_ns);
            return;
        }
    }
    if (streaming(c->h.tgid, tv)) {
        struct http_seq *s;
        if (stream_admit(c, tv, &s, detail, bytes, duration_ns))
            stream_out(c, size, s, detail, bytes, duration_ns);
        return;
    }
    rollup_add(c->h.tgid, c->call, detail, bytes, duration_ns);
}
#define EMIT(e, tv, detail, bytes, duration_ns) cuda_emit(&(e).c, sizeof(e), tv, detail, bytes, duration_ns)

/* The process's traced value (non-zero), or 0: not traced, nothing to do. */
static __always_inline u32 cuda_begin(struct cuda_header *c, u8 kind, u32 call)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tv = cuda_admit(id >> 32);
    if (!tv)
        return 0;
    fill_header(&c->h, kind, id);
    c->call = call;
    c->ret = -1;
    return tv;
}
