/* HTTP/1 requests as the kernel delimits them, for those whose records the ring buffer
 * could not all take (a collector behind its load). A read after a write starts the next
 * request. A request that lost a record is counted once, with its duration: here
 * (summarise, into req_summaries: otel_gpu/kernel_io/request_summaries.py), or by user
 * space where it saw the request's head and never heard of the loss (it ends that request
 * itself). A connection's next record tells user space how many of its records were lost
 * (`lost`): it drops what it had open there. Each connection's state is a struct
 * req_bounds in its conn_state (http_probes.c), which calls these around every record. */
#include "maps.h"

struct req_bounds {
    u32 lost;      /* records lost since the last one sent (sent on the next: sock_io_event.lost) */
    u8 phase;      /* PHASE_*: the last transfer */
    u8 req_lost;   /* a record of the current request was lost */
    u8 head_sent;  /* its first read reached user space */
    u8 told;       /* a record sent after its loss told user space (`lost`): it dropped the request */
    u8 unframed;   /* not HTTP/1 requests (any more): HTTP/2 by its prior-knowledge preface, or
                    * anything after a 101 Switching Protocols (h2c, WebSocket): no boundaries */
    u8 pad[7];
    u64 req_start; /* the current request's first read (ns) */
    u64 last_write;/* its last write (ns) */
    u64 pending;   /* a finished request with a lost record whose head user space saw, and
                    * that user space has not yet heard of: duration + 1, summarised once
                    * it has (the next record sent), dropped if it never does (the
                    * connection's close lost too: user space ends it). 0: none */
};
#define PHASE_NONE 0
#define PHASE_READ 1
#define PHASE_WRITE 2

/* By tgid: the requests summarised here (struct req_summary). */
BPF_HASH(req_summaries, u32, struct req_summary, MAX_PROCS);
/* All zeros, never written: a new entry's value (too large for the BPF stack). */
BPF_ARRAY(summary_zero, struct req_summary, 1);

/* A request with a lost record ended (its next request's first read, or the
 * connection's close): counted with its duration in its process's summary. */
static __always_inline void summarise(u32 tgid, u64 duration)
{
    u32 b = 0;
#define X(bound) b += duration > (bound);
    SUMMARY_BOUND_LIST
#undef X
    if (b > SUMMARY_BOUNDS)
        return;
    struct req_summary *s = req_summaries.lookup(&tgid);
    if (!s) {
        u32 first = 0;
        struct req_summary *zero = summary_zero.lookup(&first);
        if (!zero)
            return;
        req_summaries.insert(&tgid, zero);
        s = req_summaries.lookup(&tgid);
        if (!s)
            return;
    }
    __sync_fetch_and_add(&s->count[b], 1);
    __sync_fetch_and_add(&s->sum_ns[b], duration);
}

/* A finished request with a lost record: counted here now when user space never
 * opened it (its head was lost) or already dropped it (told); else once it is told. */
static __always_inline void request_done(u32 tgid, struct req_bounds *r, u64 duration)
{
    if (!r->head_sent || r->told)
        summarise(tgid, duration);
    else
        r->pending = duration + 1;
}

/* Before a record of an HTTP/1 connection goes out: the kernel's request boundary.
 * Returns EV_FLAG_REQ_START when this read starts a request. */
static __always_inline u8 request_boundary(u32 tgid, struct req_bounds *r, u8 kind, u64 now)
{
    if (r->unframed)
        return 0;
    if (kind == EV_SOCK_WRITE) {
        r->phase = PHASE_WRITE;
        r->last_write = now;
        return 0;
    }
    if (r->phase == PHASE_READ)
        return 0;
    if (r->phase == PHASE_WRITE && r->req_lost)
        request_done(tgid, r, r->last_write - r->req_start);
    r->req_lost = r->head_sent = r->told = 0;
    r->req_start = now;
    r->phase = PHASE_READ;
    return EV_FLAG_REQ_START;
}

/* The process's connections with untold losses (http_seq.unseen) go up or down by one. */
static __always_inline void unseen_add(u32 tgid, s32 delta)
{
    seq_word_bump(tgid);
    struct http_seq *s = http_seq.lookup(&tgid);
    if (s)
        __sync_fetch_and_add(&s->unseen, delta);
}

/* After a record of the connection went out (ret 0, carrying `told_lost` earlier
 * losses), or did not. */
static __always_inline void record_sent(u32 tgid, struct req_bounds *r, int ret, u8 flags, u32 told_lost)
{
    if (ret != 0) {
        if (!r->lost)
            unseen_add(tgid, 1);
        r->lost += 1;
        r->req_lost = !r->unframed;
        return;
    }
    if (r->lost)
        unseen_add(tgid, -1);
    r->lost = 0;
    if (flags & EV_FLAG_REQ_START)
        r->head_sent = 1;
    if (told_lost) { /* user space drops what it had open on the connection */
        if (r->req_lost)
            r->told = 1;
        if (r->pending)
            summarise(tgid, r->pending - 1);
        r->pending = 0;
    }
}

/* The connection closes, its close record sent or not (`ret`, as record_sent's). The
 * request still open counts here where user space will not count it: it never saw the
 * head, or it heard of the loss (this record, or an earlier one). */
static __always_inline void request_closed(u32 tgid, struct req_bounds *r, int ret, u32 told_lost, u64 now)
{
    record_sent(tgid, r, ret, 0, told_lost);
    if (r->req_lost && r->phase != PHASE_NONE && (!r->head_sent || r->told))
        summarise(tgid, (r->phase == PHASE_WRITE ? r->last_write : now) - r->req_start);
}
