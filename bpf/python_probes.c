/* CPython execution context: which contextvars.Context each thread of a traced
 * Python process is running, for the CUDA and socket records (their `ctx`), and
 * the copies it makes (EV_PY_CONTEXT), from exported symbols only, so stripped
 * interpreters work too. A thread's context is PyThreadState.context. Its
 * PyThreadState is found, at the record itself, in the main interpreter's thread
 * list: the one whose thread_id is the thread's pthread_self() (its FS base). The
 * list is walked once per thread and the state kept; every read checks it still
 * belongs to the thread (a state freed and made again is found again). No probe on
 * the GIL: taking it back after each blocking section (every PyTorch op) would
 * cost a trap. Offsets come from user space (otel_gpu/probes/python.py). Comes
 * before the HTTP and CUDA probes: they call py_context(). */
#include "maps.h"

#define PY_TSTATE_NEXT 8        /* offsetof(PyThreadState, next): 3.7 to 3.13 */
#define PY_THREADS_WALKED 64    /* a walk stops here: threads past it keep ctx 0 */
#define PY_REWALK_NS 100000000  /* a thread not in the list is looked for again after this */

/* tgid -> interpreter layout; set by user space once the interpreter is recognised. */
BPF_HASH(py_procs, u32, struct py_proc, MAX_PROCS);

/* pid_tgid -> the thread's PyThreadState* (0: not in the list when last walked, at
 * walked_ns). LRU: threads end unannounced. */
struct py_thread {
    u64 tstate;
    u64 walked_ns;
};
BPF_TABLE("lru_hash", u64, struct py_thread, py_tstate, 65536);

/* The main interpreter's PyThreadState whose thread_id is `self`, or 0. */
static __always_inline u64 py_walk(struct py_proc *p, u64 self)
{
    u64 interp = 0, ts = 0, id = 0;
    if (bpf_probe_read_user(&interp, sizeof(interp), (void *)p->main_interp) || !interp)
        return 0;
    if (bpf_probe_read_user(&ts, sizeof(ts), (void *)(interp + p->threads_head)))
        return 0;
    for (int i = 0; i < PY_THREADS_WALKED && ts; i++) {
        if (bpf_probe_read_user(&id, sizeof(id), (void *)(ts + p->thread_id)))
            return 0;
        if (id == self)
            return ts;
        if (bpf_probe_read_user(&ts, sizeof(ts), (void *)(ts + PY_TSTATE_NEXT)))
            return 0;
    }
    return 0;
}

/* id() of the context running on the thread; 0 when not a traced Python thread, not
 * a Python thread (yet), or one that never entered a context. */
static __always_inline u64 py_context(u32 tgid, u32 tid)
{
    struct py_proc *p = py_procs.lookup(&tgid);
    if (!p)
        return 0;
    u64 self = thread_pointer();
    if (!self)
        return 0;
    u64 key = (u64)tgid << 32 | tid, ts = 0, id = 0;
    struct py_thread *known = py_tstate.lookup(&key);
    if (known && known->tstate && !bpf_probe_read_user(&id, sizeof(id), (void *)(known->tstate + p->thread_id))
        && id == self) {
        ts = known->tstate;
    } else {
        u64 now = bpf_ktime_get_ns();
        if (known && !known->tstate && now - known->walked_ns < PY_REWALK_NS)
            return 0;
        struct py_thread found = {.tstate = py_walk(p, self), .walked_ns = now};
        py_tstate.update(&key, &found);
        ts = found.tstate;
    }
    u64 ctx = 0;
    if (ts)
        bpf_probe_read_user(&ctx, sizeof(ctx), (void *)(ts + p->context_offset));
    return ctx;
}

/* PyContext_CopyCurrent(): the attacher needs an entry handler; the return is what counts. */
int py_copy_context_enter(struct pt_regs *ctx)
{
    return 0;
}

/* Copies are streamed only while the process has HTTP activity, as CUDA calls are. */
int py_copy_context_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!py_procs.lookup(&tgid))
        return 0;
    s64 *active = http_active.lookup(&tgid);
    u64 copy = PT_REGS_RC(ctx);
    if (!active || *active <= 0 || !copy)
        return 0;
    struct py_context_event e = {};
    fill_header(&e.h, EV_PY_CONTEXT, id);
    e.ctx = copy;
    e.parent = py_context(tgid, (u32)id);
    epoch_submit(&e, sizeof(e), &e.h, 0); /* a new binding: calls counted before it stay before it */
    return 0;
}
