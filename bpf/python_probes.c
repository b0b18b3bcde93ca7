/* CPython execution context: which contextvars.Context each thread of a traced
 * Python process is running, for the CUDA and socket records (their `ctx`), and
 * the copies it makes (EV_PY_CONTEXT), from exported symbols only, so stripped
 * interpreters work too. A thread's PyThreadState* is the argument of
 * PyEval_RestoreThread (every re-take of the GIL after a blocking section) and
 * PyEval_AcquireThread (a new thread's first take); its running context is the
 * pointer at PyThreadState + context_offset (per CPython version, from user space).
 * Entry probes, not a return probe on PyEval_SaveThread: half the cost per GIL
 * release, the same thread state. Comes before the HTTP and CUDA probes: they
 * call py_context(). */
#include "maps.h"

/* tgid -> interpreter layout; set by user space once the interpreter is recognised. */
BPF_HASH(py_procs, u32, struct py_proc, MAX_PROCS);

/* pid_tgid -> the thread's PyThreadState*. LRU: threads end unannounced. */
BPF_TABLE("lru_hash", u64, u64, py_tstate, 65536);

/* id() of the context running on the thread; 0 when not a traced Python thread,
 * its state is not known yet, or it never entered a context. */
static __always_inline u64 py_context(u32 tgid, u32 tid)
{
    struct py_proc *p = py_procs.lookup(&tgid);
    if (!p)
        return 0;
    u64 key = (u64)tgid << 32 | tid;
    u64 *ts = py_tstate.lookup(&key);
    if (!ts)
        return 0;
    u64 ctx = 0;
    bpf_probe_read_user(&ctx, sizeof(ctx), (void *)(*ts + p->context_offset));
    return ctx;
}

/* PyEval_RestoreThread(PyThreadState *tstate), PyEval_AcquireThread(tstate) */
int py_thread_state(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!py_procs.lookup(&tgid)) /* the file is probed for every process mapping it */
        return 0;
    u64 ts = PT_REGS_PARM1(ctx);
    u64 *known = py_tstate.lookup(&id);
    if (ts && !(known && *known == ts)) /* the common case writes nothing */
        py_tstate.update(&id, &ts);
    return 0;
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
