/* Where each thread of a traced process spends its time: running, runnable (waiting for a
 * CPU), off the CPU inside a synchronising GPU call, or off the CPU for any other reason.
 * bpf/sched_probes.c keeps the sums at each context switch; here, the table and the
 * snapshot a socket record carries (EV_FLAG_TIMES), from which user space splits a
 * request's time between its first read and its answer (otel_gpu/pipeline/time_split.py).
 *
 * No wake-up tracepoint: a thread's time off the CPU goes to the part it left in (blocked,
 * or waiting on the GPU), and the share of it spent waiting for a CPU once woken is the
 * kernel's own count, task_struct.sched_info.run_delay (CONFIG_SCHED_INFO: the runqueue
 * wait of each arrival, added as the thread is switched in). It is read while the thread
 * runs, at its next snapshot or switch away (settle), and moved from that part to cpu_wait.
 * So a switch on the host runs one program, and a request's split is exact at each of its
 * snapshots. A thread is known from its first snapshot or switch away while its process is
 * traced, and forgotten at its exit. */
#include "maps.h"

/* A thread's state is the part its time goes to (events.h enum time_part). */
enum thread_state {
    THREAD_RUNNING = TIME_ON_CPU,
    THREAD_RUNNABLE = TIME_CPU_WAIT,
    THREAD_SYNC = TIME_GPU_SYNC,       /* off the CPU inside a synchronising GPU call */
    THREAD_BLOCKED = TIME_BLOCKED,     /* off the CPU otherwise (I/O, a lock, a sleep) */
};

struct thread_time {
    u64 since;            /* when it entered `state` */
    u64 ns[TIME_PARTS];   /* time in each part so far */
    u32 state;            /* enum thread_state */
    u32 off_state;        /* the part its last time off the CPU went to, until settled */
    u64 off_ns;           /* that time (0: settled) */
    u64 run_delay;        /* its sched_info.run_delay when last settled */
};
/* tid -> its sums. Made by need (maps.h BY_NEED): one entry a thread of a traced process. */
BPF_F_TABLE("hash", u32, struct thread_time, thread_times, 65536, BY_NEED);

#define TIMES_ON (TIME_SPLIT && TASK_PID_OFFSET >= 0 && TASK_TGID_OFFSET >= 0 && TASK_STATE_OFFSET >= 0 \
                   && TASK_RUN_DELAY_OFFSET >= 0)  /* off: --no-time-split, or no BTF */

/* The running thread's runqueue wait so far (ns). */
static __always_inline u64 current_run_delay(void)
{
    u64 delay = 0;
    bpf_probe_read_kernel(&delay, sizeof(delay), (void *)bpf_get_current_task() + TASK_RUN_DELAY_OFFSET);
    return delay;
}

static __always_inline void thread_time_add(struct thread_time *t, u64 now)
{
    if (now > t->since)
        t->ns[t->state & (TIME_PARTS - 1)] += now - t->since;
    t->since = now;
}

/* `t`'s thread runs now (thread_times_settle's first step). Where its switch in went
 * unseen (the sched_switch program did not run for it: seen here, rarely, as two switches
 * away in a row), it is taken as now: its time since the switch away stays in the part it
 * left in, and its wait for a CPU in it moves at the settle, so cpu_wait stays the
 * kernel's count; what it ran since stays in that part too. */
static __always_inline void thread_times_running(struct thread_time *t, u64 now)
{
    if (t->state == THREAD_RUNNING)
        return;
    count(CNT_SWITCH_UNSEEN);
    u64 since = t->since;
    thread_time_add(t, now);
    t->off_state = t->state;
    t->off_ns = now > since ? now - since : 0;
    t->state = THREAD_RUNNING;
}

/* `t` is the running thread's (it is switching away, or it is the current task): what it
 * waited for a CPU since its last settle moves from the part its last time off the CPU went
 * to (asleep, or in a sync call: woken, then queued) to cpu_wait, up to that time.
 * Preempted, it was counted runnable already. */
static __always_inline void thread_times_settle(struct thread_time *t, u64 now)
{
    thread_times_running(t, now);
    u64 delay = current_run_delay();
    u64 waited = delay > t->run_delay ? delay - t->run_delay : 0;
    t->run_delay = delay;
    u32 off = t->off_state;
    if (t->off_ns && (off == THREAD_SYNC || off == THREAD_BLOCKED)) {
        u64 moved = waited < t->off_ns ? waited : t->off_ns;
        if (off == THREAD_SYNC)  /* constant indices: the verifier bounds them */
            t->ns[THREAD_SYNC] -= moved;
        else
            t->ns[THREAD_BLOCKED] -= moved;
        t->ns[THREAD_RUNNABLE] += moved;
    }
    t->off_ns = 0;
}

/* The running thread's entry, made if it has none (counted when the table is full). */
static __always_inline struct thread_time *thread_times_of_current(u32 tid, u64 now)
{
    struct thread_time *t = thread_times.lookup(&tid);
    if (t)
        return t;
    struct thread_time fresh = {.since = now, .state = THREAD_RUNNING, .run_delay = current_run_delay()};
    if (thread_times.insert(&tid, &fresh) == -E2BIG)
        count(CNT_THREAD_TIMES_FULL);  /* its requests get no split */
    return thread_times.lookup(&tid);
}

/* The running thread's time until `now` into `out` (the part it is in counted up to now);
 * 0 when the split is off or the table is full. */
static __always_inline int thread_times_now(u32 tid, u64 now, u64 *out)
{
#if TIMES_ON
    if ((u32)bpf_get_current_pid_tgid() != tid)
        return 0;
    struct thread_time *t = thread_times_of_current(tid, now);
    if (!t)
        return 0;
    thread_times_settle(t, now);
#pragma unroll
    for (int i = 0; i < TIME_PARTS; i++)
        out[i] = t->ns[i];
    u32 state = t->state;
    if (state < TIME_PARTS && now > t->since)
        out[state & (TIME_PARTS - 1)] += now - t->since;
    return 1;
#else
    return 0;
#endif
}
