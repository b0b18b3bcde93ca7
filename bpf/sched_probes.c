/* The sched tracepoint that keeps bpf/thread_times.c's sums (after cuda_probes.c: a thread
 * switched away inside a synchronising call, in_call, is waiting on the GPU). Every context
 * switch on the host runs it, so it is a raw tracepoint (no perf record: a no-op program on
 * the perf-event tracepoints cost ~140 ns a switch here, bench item 17), and the only one:
 * the wait for a CPU after a wake-up is the kernel's own count (thread_times.c settle), not
 * a sched_wakeup program on every wake-up of the host. An untraced thread costs a read and
 * its process's flags. Its arguments are the kernel's own (preempt, prev, next), the task's
 * pid and state read at offsets from the running kernel's BTF. A switch away preempted, or
 * in TASK_RUNNING (a yield), is runnable; anything else is off the CPU (waiting on the GPU
 * inside a synchronising call, else blocked) until it runs again. */
#include "maps.h"

#if TIMES_ON  /* bpf/thread_times.c: the split on (the default), and BTF */

static __always_inline int in_sync_call(u64 pid_tgid)
{
    struct call_entry *c = in_call.lookup(&pid_tgid);
    return c && CALL_IS_SYNC(c->call);  /* generated from otel_gpu/cuda_calls.py */
}

/* The task's thread id when its process is traced, else 0: an untraced task costs two
 * reads and the pid_bits flags, no hash lookup. */
static __always_inline u32 traced_tid(void *task)
{
    u32 tgid = 0, pid = 0;
    bpf_probe_read_kernel(&tgid, sizeof(tgid), task + TASK_TGID_OFFSET);
    if (!(pid_flags(tgid) & PID_TRACED))
        return 0;
    bpf_probe_read_kernel(&pid, sizeof(pid), task + TASK_PID_OFFSET);
    return pid;
}

/* The part a thread seen switching in while it was taken as running had left in, its
 * switch away unseen: inside a synchronising call, else blocked. Its time since it was
 * last seen goes there, and the kernel's count of its wait for a CPU moves from it to
 * cpu_wait at its next settle, as after any time off the CPU: cpu_wait stays the kernel's
 * count; what it ran before the unseen switch is counted off the CPU. */
static __always_inline u32 off_state_of(void *task, u32 tid)
{
    count(CNT_SWITCH_UNSEEN);
    u32 tgid = 0;
    bpf_probe_read_kernel(&tgid, sizeof(tgid), task + TASK_TGID_OFFSET);
    return in_sync_call((u64)tgid << 32 | tid) ? THREAD_SYNC : THREAD_BLOCKED;
}

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...) */
RAW_TRACEPOINT_PROBE(sched_switch)
{
    u64 id = bpf_get_current_pid_tgid();  /* prev: the task switching away, still current */
    u32 prev = (u32)id, next = traced_tid((void *)ctx->args[2]);
    int prev_traced = prev && (pid_flags(id >> 32) & PID_TRACED);
    if (!prev_traced && !next)
        return 0;  /* neither is ours: most switches on a node */
    u64 now = bpf_ktime_get_ns();
    if (prev_traced) {
        struct thread_time *t = thread_times_of_current(prev, now);
        if (t) {
            u32 state = 0;
            if (!ctx->args[0])
                bpf_probe_read_kernel(&state, sizeof(state), (void *)ctx->args[1] + TASK_STATE_OFFSET);
            thread_times_settle(t, now);
            thread_time_add(t, now);
            t->state = ctx->args[0] || state == 0 ? THREAD_RUNNABLE : in_sync_call(id) ? THREAD_SYNC : THREAD_BLOCKED;
        }
    }
    struct thread_time *n = next ? thread_times.lookup(&next) : 0;
    if (n) {
        if (n->state == THREAD_RUNNING)  /* its switch away went unseen (thread_times.c) */
            n->state = off_state_of((void *)ctx->args[2], next);
        u64 since = n->since;
        thread_time_add(n, now);
        n->off_state = n->state;  /* its wait for a CPU in it: settled once it runs */
        n->off_ns = now > since ? now - since : 0;
        n->state = THREAD_RUNNING;
    }
    return 0;
}

#endif /* TIMES_ON: off with --no-time-split */
