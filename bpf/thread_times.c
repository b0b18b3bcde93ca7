/* Where each thread of a traced process spends its time: running, runnable (waiting for a
 * CPU), off the CPU inside a synchronising GPU call, or off the CPU for any other reason.
 * bpf/sched_probes.c keeps the sums at each context switch and wake-up; here, the table
 * and the snapshot a socket record carries (EV_FLAG_TIMES), from which user space splits a
 * request's time between its first read and its answer (otel_gpu/pipeline/time_split.py).
 * A thread is known from its start, or its first switch away, while its process is traced,
 * and forgotten at its exit. */
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
    u32 pad;
};
/* tid -> its sums. Made by need (maps.h BY_NEED): one entry a thread of a traced process. */
BPF_F_TABLE("hash", u32, struct thread_time, thread_times, 65536, BY_NEED);

/* The thread's time until `now` into `out` (the part it is in counted up to now); 0 when
 * the sched probes do not know it yet. */
static __always_inline int thread_times_now(u32 tid, u64 now, u64 *out)
{
    struct thread_time *t = thread_times.lookup(&tid);
    if (!t)
        return 0;
#pragma unroll
    for (int i = 0; i < TIME_PARTS; i++)
        out[i] = t->ns[i];
    u32 state = t->state;
    if (state < TIME_PARTS && now > t->since)
        out[state & (TIME_PARTS - 1)] += now - t->since;
    return 1;
}
