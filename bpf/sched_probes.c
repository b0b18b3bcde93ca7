/* The sched tracepoints that keep bpf/thread_times.c's sums (after cuda_probes.c: a thread
 * switched away inside a synchronising call, in_call, is waiting on the GPU). Every
 * context switch and wake-up on the host runs them: an untraced thread costs one array
 * read (pid_bits) and one hash miss. Preempted (prev_state has no sleep bit: the kernel
 * reports TASK_RUNNING, or TASK_REPORT_MAX for a preemption) is runnable; anything else
 * is off the CPU until its wake-up. */
#include "maps.h"

#if TIME_SPLIT  /* off with --no-time-split: no sched tracepoint, no split */

#define TASK_SLEEP_BITS 0xff /* TASK_REPORT and TASK_REPORT_IDLE: a sleep of some kind */

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

TRACEPOINT_PROBE(sched, sched_switch)
{
    u64 now = bpf_ktime_get_ns();
    u64 id = bpf_get_current_pid_tgid();  /* prev: the task switching away */
    u32 prev = args->prev_pid, next = args->next_pid;
    if (prev && (pid_flags(id >> 32) & PID_TRACED)) {
        struct thread_time *t = thread_times.lookup(&prev);
        if (!t) {
            struct thread_time fresh = {.since = now, .state = THREAD_RUNNING};
            if (thread_times.insert(&prev, &fresh) == -E2BIG)
                count(CNT_THREAD_TIMES_FULL);  /* its requests get no split */
            t = thread_times.lookup(&prev);
        }
        if (t) {
            thread_time_add(t, now);
            t->state = !(args->prev_state & TASK_SLEEP_BITS) ? THREAD_RUNNABLE :
                       in_sync_call(id) ? THREAD_SYNC : THREAD_BLOCKED;
        }
    }
    struct thread_time *n = next ? thread_times.lookup(&next) : 0;
    if (n) {
        thread_time_add(n, now);
        n->state = THREAD_RUNNING;
    }
    return 0;
}

static __always_inline void woken(u32 tid)
{
    struct thread_time *t = thread_times.lookup(&tid);
    if (t && (t->state == THREAD_SYNC || t->state == THREAD_BLOCKED)) {
        thread_time_add(t, bpf_ktime_get_ns());
        t->state = THREAD_RUNNABLE;
    }
}

TRACEPOINT_PROBE(sched, sched_wakeup) { woken(args->pid); return 0; }

/* A new task, woken by the one that made it: a thread of a traced process is known from
 * its start (a server's thread per connection may read its request before any switch). */
TRACEPOINT_PROBE(sched, sched_wakeup_new)
{
    u32 tid = args->pid;
    if (pid_flags(bpf_get_current_pid_tgid() >> 32) & PID_TRACED) {
        struct thread_time fresh = {.since = bpf_ktime_get_ns(), .state = THREAD_RUNNABLE};
        if (thread_times.insert(&tid, &fresh) == -E2BIG)
            count(CNT_THREAD_TIMES_FULL);
    }
    return 0;
}
#endif /* TIME_SPLIT */
