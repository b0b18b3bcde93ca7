/* Calls counted per request (req_agg), and the verdict that sends them there: the
 * CUDA calls of a process with HTTP activity that are not streamed one by one
 * (bpf/call_out.c decides) are counted by (thread, execution unit, HTTP epoch, call,
 * detail); user space places each count before the first record of a later epoch.
 *
 * A thread past its budget (an LLM decode loop inside one request) stays past it
 * until its process's next HTTP read, and a process with no sampled request open
 * stays quiet until user space says otherwise. Deciding that again at every call cost
 * six lookups (traced, http_active, the execution unit, quiet_procs, the budget, the
 * ring's fill level): the verdict is kept per thread in a slot of `verdict_slots`
 * instead, and holds while nothing it was decided from has changed:
 *  - the process's http_seq (epoch, reads, unseen): every HTTP record, context copy and
 *    goroutine binding bumps the epoch, and so does a change of its HTTP activity; every
 *    change bumps the process's word in http_seq_words first (maps.h), which is what a
 *    call reads, and the epoch and unseen it counts under are the verdict's copies;
 *  - `verdict_gen`, which user space bumps after each change of `traced`, py_procs,
 *    go_procs or quiet_procs (otel_gpu/kernel_io/program.py);
 *  - the thread's Python context, read again at each call from its PyThreadState
 *    (whose owner is checked: a freed state can come back for another thread).
 * A Go process's calls are decided at each call: goroutines move between threads. */
#include "maps.h"

BPF_F_TABLE("hash", struct agg_key, struct agg_value, req_agg, AGG_ENTRIES, BY_NEED);  /* maps.h */

/* One more call in req_agg, under the process's HTTP epoch `epoch`. Only the calling
 * thread writes its keys: no atomics. */
static __always_inline void agg_add(struct cuda_header *c, u32 epoch, u64 detail, u64 bytes, u64 duration_ns)
{
    struct agg_key k = {.tgid = c->h.tgid, .tid = c->h.tid, .epoch = epoch,
                        .call = c->call | (c->h.flags & EV_FLAG_HTTP_UNSEEN ? AGG_HTTP_UNSEEN : 0),
                        .detail = detail, .ctx = c->ctx};
    u64 end = c->h.ts_ns + duration_ns;
    struct agg_value *v = req_agg.lookup(&k);
    if (v) {
        v->count++;
        v->bytes += bytes;
        v->duration_ns += duration_ns;
        v->last_ts = c->h.ts_ns;
        if (end > v->last_end_ts)
            v->last_end_ts = end;
    } else {
        struct agg_value nv = {.count = 1, .bytes = bytes, .duration_ns = duration_ns,
                               .first_ts = c->h.ts_ns, .last_ts = c->h.ts_ns, .last_end_ts = end};
        if (req_agg.update(&k, &nv) != 0) {
            count(CNT_AGG_FULL);
            return;
        }
    }
    count(CNT_AGGREGATED);
}

BPF_ARRAY(verdict_gen, u32, 1);

static __always_inline u32 verdict_gen_now(void)
{
    u32 zero = 0, *g = verdict_gen.lookup(&zero);
    return g ? *g : 0;
}

/* What a thread's verdict was decided from (the word, verdict_gen and http_seq are read
 * before the decision, the word first: a change during it shows as a difference at the
 * next call). */
struct verdict_basis {
    u32 word;    /* the process's http_seq_words entry */
    u32 gen;
    u32 epoch;   /* http_seq's, as the word says they still are */
    u32 reads;
    u32 unseen;
};

/* A thread's standing verdict: count its calls in req_agg. */
struct counted_thread {
    struct verdict_basis basis;
    u32 ctx_offset;  /* Python: offsetof(PyThreadState, context) */
    u64 unit;        /* the execution unit it was decided for: its Python context, or 0 */
    u64 tstate;      /* Python: the thread's PyThreadState*; 0: a plain thread */
    u64 self;        /* Python: the thread's pthread_self(), the state's thread_id */
    u32 id_offset;   /* Python: offsetof(PyThreadState, thread_id) */
    u32 pad;
};

/* The verdicts, direct-mapped by pid_tgid: an inlined array read and a check, where an
 * LRU hash lookup cost ~37 ns a run in a standalone check (docs/performance.md notes 29,
 * 31). A slot is a cache, never the truth: a thread whose slot holds another thread's
 * verdict (two hot threads sharing a slot, or an old one) decides again, as it would with
 * no verdict.
 * Slots are written by several CPUs without a lock (the threads sharing one): `check`
 * mixes every other field, so a slot read while another CPU writes it is a miss, never a
 * verdict made of two. Nothing to delete: an exited process's slots fail at its next
 * verdict_gen. */
#define VERDICT_SLOT_BITS 13
struct verdict_slot {
    u64 id;     /* the pid_tgid it was decided for */
    struct counted_thread t;
    u64 check;  /* verdict_check() of the fields above */
};
BPF_ARRAY(verdict_slots, struct verdict_slot, 1 << VERDICT_SLOT_BITS);

static __always_inline struct verdict_slot *verdict_slot_of(u64 id)
{
    u32 i = (id * FIB_MIX) >> (64 - VERDICT_SLOT_BITS);
    return verdict_slots.lookup(&i);
}

static __always_inline u64 mix_in(u64 h, u64 v)
{
    return (h ^ v) * FIB_MIX;
}

static __always_inline u64 verdict_check(u64 id, struct counted_thread *t)
{
    u64 h = mix_in(id, (u64)t->basis.word << 32 | t->basis.gen);
    h = mix_in(h, (u64)t->basis.epoch << 32 | t->basis.reads);
    h = mix_in(h, (u64)t->basis.unseen << 32 | t->ctx_offset);
    h = mix_in(h, t->unit);
    h = mix_in(h, t->tstate);
    h = mix_in(h, t->self);
    return mix_in(h, t->id_offset);
}

/* Before a decision: what it is made from (`s`: the process's http_seq, or NULL). */
static __always_inline struct verdict_basis verdict_basis_now(u32 tgid, struct http_seq *s)
{
    struct verdict_basis b = {};
    u32 *w = seq_word(tgid);
    if (w)
        b.word = *w;
    b.gen = verdict_gen_now();
    if (s) {
        b.epoch = s->epoch;
        b.reads = s->reads;
        b.unseen = s->unseen;
    }
    return b;
}

/* The thread's calls go to req_agg until its basis changes (call_out.c, after a verdict
 * that stands: the budget spent, or the process quiet). */
static __always_inline void remember_counted(u32 tgid, u64 id, u64 unit, struct verdict_basis basis)
{
    if (go_procs.lookup(&tgid))
        return;
    struct counted_thread t = {.basis = basis, .unit = unit};
    struct py_proc *p = py_procs.lookup(&tgid);
    if (p) {
        struct py_thread *known = py_tstate.lookup(&id);
        if (!known || !known->tstate)
            return; /* not a Python thread yet: its context is looked for at each call */
        t.tstate = known->tstate;
        t.self = thread_pointer();
        t.ctx_offset = p->context_offset;
        t.id_offset = p->thread_id;
    }
    struct verdict_slot *slot = verdict_slot_of(id);
    if (!slot)
        return;
    slot->id = id;
    slot->t = t;
    slot->check = verdict_check(id, &t);
}

/* A call counted under its thread's standing verdict: the unit, epoch and losses to count it with. */
struct verdict_held {
    u64 unit;
    u32 epoch;
    u32 unseen;
};

/* 1 when the calling thread's standing verdict holds (the caller then counts the call:
 * counted_add), with *held set from it; else 0. Three inlined array reads: its slot, its
 * process's word and verdict_gen; the process's http_seq is not read. */
static __always_inline int standing_verdict(u32 tgid, u64 id, struct verdict_held *held)
{
    struct verdict_slot *slot = verdict_slot_of(id);
    if (!slot || slot->id != id)
        return 0;
    struct counted_thread copy = slot->t, *t = &copy;  /* one copy, checked whole */
    if (slot->check != verdict_check(id, t))
        return 0;
    u32 *w = seq_word(tgid);
    if (!w || *w != t->basis.word || verdict_gen_now() != t->basis.gen)
        return 0;
    u64 unit = 0;
    if (t->tstate) {
        u64 owner = 0;
        if (bpf_probe_read_user(&owner, sizeof(owner), (void *)(t->tstate + t->id_offset)) || owner != t->self
            || bpf_probe_read_user(&unit, sizeof(unit), (void *)(t->tstate + t->ctx_offset)))
            return 0;
    }
    if (unit != t->unit)
        return 0;
    held->unit = unit;
    held->epoch = t->basis.epoch;
    held->unseen = t->basis.unseen;
    return 1;
}

/* A call (its header filled) counted under its thread's standing verdict. */
static __always_inline void counted_add(struct cuda_header *c, struct verdict_held *held, u64 detail, u64 bytes,
                                        u64 duration_ns)
{
    c->ctx = held->unit;
    if (held->unseen)
        c->h.flags |= EV_FLAG_HTTP_UNSEEN;
    agg_add(c, held->epoch, detail, bytes, duration_ns);
}
