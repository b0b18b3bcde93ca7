/* CPython execution context: which contextvars.Context each thread of a traced
 * Python process is running, for the CUDA and socket records (their `ctx`), and
 * the copies it makes (EV_PY_CONTEXT), from exported symbols only, so stripped
 * interpreters work too. A thread's context is PyThreadState.context; its state is
 * the one in the main interpreter's thread list whose thread_id is the thread's
 * pthread_self() (its FS base). Found at the record itself, once per thread, and kept
 * (checked at every read: a state freed and made again is found again):
 * - among the newest PY_THREADS_WALKED states, walked from the list's head (a thread
 *   made since user space last read the list is near the head);
 * - else in py_threads, the whole list as user space read it at the process's start
 *   of tracing and at each /proc scan (otel_gpu/probes/python.py thread_states).
 * The walk stays short: a loop is verified once per step in every program that reads
 * contexts, and programs are verified as a process's probes attach (its first
 * requests wait on it). No probe on the GIL: taking it back after each blocking
 * section (every PyTorch op) would cost a trap. Offsets come from user space
 * (probes/python.py). Comes before the HTTP and CUDA probes: they call py_context(). */
#include "maps.h"

/* PY_TSTATE_NEXT (offsetof(PyThreadState, next)) and PY_THREADS_WALKED (states walked
 * from the list's head) come from probes/python.py, as -D cflags (probes/source.py). */
#if !defined(PY_TSTATE_NEXT) || !defined(PY_THREADS_WALKED)
#error "PY_TSTATE_NEXT/PY_THREADS_WALKED missing: compose the program with otel_gpu.probes.source"
#endif
#define PY_REWALK_NS 100000000  /* a thread found nowhere is looked for again after this */

/* tgid -> interpreter layout; set by user space once the interpreter is recognised. */
BPF_HASH(py_procs, u32, struct py_proc, MAX_PROCS);

/* (tgid, pthread_self()) -> its PyThreadState*: every state of each traced process's
 * main interpreter, written by user space. */
BPF_F_TABLE("hash", struct py_thread_key, u64, py_threads, 65536, BY_NEED);

/* pid_tgid -> the thread's PyThreadState* (0: found nowhere when last looked for, at
 * walked_ns). LRU: threads end unannounced. */
struct py_thread {
    u64 tstate;
    u64 walked_ns;
};
BPF_TABLE("lru_hash", u64, struct py_thread, py_tstate, 65536);

/* 1 when the state at `ts` is the thread `self`'s. */
static __always_inline int py_state_of(struct py_proc *p, u64 ts, u64 self)
{
    u64 id = 0;
    return ts && !bpf_probe_read_user(&id, sizeof(id), (void *)(ts + p->thread_id)) && id == self;
}

/* The thread's state among the newest of the list, else as user space listed it; 0. */
static __always_inline u64 py_find(struct py_proc *p, u32 tgid, u64 self)
{
    u64 interp = 0, ts = 0;
    if (!bpf_probe_read_user(&interp, sizeof(interp), (void *)p->main_interp) && interp
        && !bpf_probe_read_user(&ts, sizeof(ts), (void *)(interp + p->threads_head))) {
        for (int i = 0; i < PY_THREADS_WALKED && ts; i++) {
            if (py_state_of(p, ts, self))
                return ts;
            if (bpf_probe_read_user(&ts, sizeof(ts), (void *)(ts + PY_TSTATE_NEXT)))
                break;
        }
    }
    struct py_thread_key k = {.tgid = tgid, .thread = self};
    u64 *listed = py_threads.lookup(&k);
    return listed && py_state_of(p, *listed, self) ? *listed : 0;
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
    u64 key = (u64)tgid << 32 | tid, ts = 0;
    struct py_thread *known = py_tstate.lookup(&key);
    if (known && py_state_of(p, known->tstate, self)) {
        ts = known->tstate;
    } else {
        u64 now = bpf_ktime_get_ns();
        if (known && !known->tstate && now - known->walked_ns < PY_REWALK_NS)
            return 0;
        struct py_thread found = {.tstate = py_find(p, tgid, self), .walked_ns = now};
        py_tstate.update(&key, &found);
        ts = found.tstate;
    }
    u64 ctx = 0;
    if (ts)
        bpf_probe_read_user(&ctx, sizeof(ctx), (void *)(ts + p->context_offset));
    return ctx;
}

/* The head decision a copy takes from its parent (defined in head_sampling.c, which comes later). */
static __always_inline void head_inherited(u32 tgid, u64 id, u64 parent, u64 copy);

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
    head_inherited(tgid, id, e.parent, copy);
    epoch_submit(&e, sizeof(e), &e.h, 0); /* a new binding: calls counted before it stay before it */
    return 0;
}
