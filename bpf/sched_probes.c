/* The sched tracepoints that keep bpf/thread_times.c's sums (after cuda_probes.c: a thread
 * switched away inside a synchronising call, in_call, is waiting on the GPU). Every
 * context switch and wake-up on the host runs them, so they are raw tracepoints: no perf
 * record is made for them (a no-op program on the perf-event tracepoints cost ~140 ns a
 * switch here, bench item 17), and an untraced thread costs a read and its process's flags.
 * Their arguments are the kernel's own (sched_switch: preempt, prev, next; sched_wakeup(_new):
 * the task), the task's pid and state read at offsets from the running kernel's BTF.
 * A switch away preempted, or in TASK_RUNNING (a yield), is runnable; anything else is off
 * the CPU until its wake-up. */
#include "maps.h"

#if TIME_SPLIT && TASK_PID_OFFSET >= 0 && TASK_TGID_OFFSET >= 0 && TASK_STATE_OFFSET >= 0  /* off: --no-time-split, or no BTF */

static __always_inline void thread_time_add(struct thread_time *t, u64 now)
{
    if (now > t->since)
        t->ns[t->state & (TIME_PARTS - 1)] += now - t->since;
    t->since = now;
}

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

/* sched_switch(bool preempt, struct task_struct *prev, struct task_struct *next, ...) */
RAW_TRACEPOINT_PROBE(sched_switch)
{
    u64 id = bpf_get_current_pid_tgid();  /* prev: the task switching away */
    u32 prev = (u32)id, next = traced_tid((void *)ctx->args[2]);
    int prev_traced = prev && (pid_flags(id >> 32) & PID_TRACED);
    if (!prev_traced && !next)
        return 0;  /* neither is ours: most switches on a node */
    u64 now = bpf_ktime_get_ns();
    if (prev_traced) {
        struct thread_time *t = thread_times.lookup(&prev);
        if (!t) {
            struct thread_time fresh = {.since = now, .state = THREAD_RUNNING};
            if (thread_times.insert(&prev, &fresh) == -E2BIG)
                count(CNT_THREAD_TIMES_FULL);  /* its requests get no split */
            t = thread_times.lookup(&prev);
        }
        if (t) {
            u32 state = 0;
            if (!ctx->args[0])
                bpf_probe_read_kernel(&state, sizeof(state), (void *)ctx->args[1] + TASK_STATE_OFFSET);
            thread_time_add(t, now);
            t->state = ctx->args[0] || state == 0 ? THREAD_RUNNABLE : in_sync_call(id) ? THREAD_SYNC : THREAD_BLOCKED;
        }
    }
    struct thread_time *n = next ? thread_times.lookup(&next) : 0;
    if (n) {
        thread_time_add(n, now);
        n->state = THREAD_RUNNING;
    }
    return 0;
}

/* sched_wakeup(struct task_struct *p) */
RAW_TRACEPOINT_PROBE(sched_wakeup)
{
    u32 tid = traced_tid((void *)ctx->args[0]);
    struct thread_time *t = tid ? thread_times.lookup(&tid) : 0;
    if (t && (t->state == THREAD_SYNC || t->state == THREAD_BLOCKED)) {
        thread_time_add(t, bpf_ktime_get_ns());
        t->state = THREAD_RUNNABLE;
    }
    return 0;
}

/* sched_wakeup_new(struct task_struct *p): a new task, woken by the one that made it. A
 * thread of a traced process is known from its start (a server's thread per connection
 * may read its request before any switch). */
RAW_TRACEPOINT_PROBE(sched_wakeup_new)
{
    if (pid_flags(bpf_get_current_pid_tgid() >> 32) & PID_TRACED) {
        u32 tid = 0;
        bpf_probe_read_kernel(&tid, sizeof(tid), (void *)ctx->args[0] + TASK_PID_OFFSET);
        struct thread_time fresh = {.since = bpf_ktime_get_ns(), .state = THREAD_RUNNABLE};
        if (tid && thread_times.insert(&tid, &fresh) == -E2BIG)
            count(CNT_THREAD_TIMES_FULL);
    }
    return 0;
}

#endif /* TIME_SPLIT: opt-in (--time-split) */
