/* Launch slots: the launch fast path's tally (bpf/cuda_probes.c), a direct-mapped table
 * of (process, kernel) launch counts per CPU in front of the `rollup` hash. A hit is an
 * inlined array read and an add, where the hash costs a helper call, hashing a 16-byte
 * key and a bucket walk (bench item 1: ~70 vs ~120 ns of BPF time per launch; bpftrace's
 * count() takes ~100). A kernel whose slot another (process, kernel) holds is counted in
 * `rollup` as before. User space sums both (otel_gpu/pipeline/launch_slots.py).
 *
 * Each CPU owns its LAUNCH_SLOTS entries, but a uprobe program runs with migration
 * disabled, not preemption (a PREEMPT_DYNAMIC kernel booted preempt=full, or any
 * preemptible one): another thread can run this program on the same CPU while one is
 * in the middle of it. So a hit adds atomically, and a slot is taken by one writer
 * only: a compare-and-swap from the owner it saw to SLOT_CLAIMING, which every other
 * writer leaves alone (it counts in `rollup`), then func and count, then the new
 * tgid. User space reads the memory-mapped array while it is written: tgid first
 * (x86 keeps the order of stores and of loads), so a tgid it reads comes with its own
 * func and count, or with the next owner's only when the old owner was already
 * released, which user space then skips (it reads only the processes it traces, and
 * SLOT_CLAIMING is none).
 *
 * An entry is claimed only for a process user space traces (its TRACED bit in pid_bits'
 * user word), and taken from another owner only once that owner has no bit left in
 * either word: user space clears its bit after the process's last counts were read. */
#include "maps.h"

#ifndef LAUNCH_CPUS
#define LAUNCH_CPUS 1
#endif
#ifndef LAUNCH_SLOTS_LOG2 /* from otel_gpu/probes/launch_slots.py */
#define LAUNCH_SLOTS_LOG2 9
#endif
#define LAUNCH_SLOTS (1 << LAUNCH_SLOTS_LOG2) /* per CPU */

BPF_F_TABLE("array", u32, struct launch_slot, launch_slots, LAUNCH_CPUS * LAUNCH_SLOTS, BPF_F_MMAPABLE);

static __always_inline u32 launch_slot_index(u32 tgid, u64 func)
{
    /* Fibonacci hashing: consecutive pids and 16-byte-aligned stubs spread over the slots. */
    return (((u32)(func >> 4) ^ (u32)(func >> 20) ^ tgid) * 0x9E3779B1u) >> (32 - LAUNCH_SLOTS_LOG2);
}

/* Counts one launch of func by tgid in this CPU's slot: 1, or 0 when the slot is held
 * by another (process, kernel) still known (the caller counts it in `rollup`). */
static __always_inline int launch_slot_add(u32 tgid, u64 func)
{
    u32 cpu = bpf_get_smp_processor_id();
    if (cpu >= LAUNCH_CPUS)
        return 0;
    u32 i = cpu * LAUNCH_SLOTS + launch_slot_index(tgid, func);
    struct launch_slot *s = launch_slots.lookup(&i);
    if (!s)
        return 0;
    u64 owner = s->tgid;
    if (owner == tgid && s->func == func) {
        __sync_fetch_and_add(&s->count, 1);
        return 1;
    }
    if (owner == SLOT_CLAIMING || (owner && pid_flags((u32)owner)) || !user_traced(tgid))
        return 0;
    if (__sync_val_compare_and_swap(&s->tgid, owner, SLOT_CLAIMING) != owner)
        return 0; /* another writer took it first */
    s->func = func;
    s->count = 1;
    asm volatile("" ::: "memory"); /* func and count before the owner (see above) */
    s->tgid = tgid;
    return 1;
}
