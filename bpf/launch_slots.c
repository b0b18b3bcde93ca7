/* Launch slots: the launch fast path's tally (bpf/cuda_probes.c), a direct-mapped table
 * of (process, kernel) launch counts per CPU in front of the `rollup` hash. A hit is an
 * inlined array read and an add, where the hash costs a helper call, hashing a 16-byte
 * key and a bucket walk (bench item 1: ~70 vs ~120 ns of BPF time per launch; bpftrace's
 * count() takes ~100). A kernel whose slot another (process, kernel) holds is counted in
 * `rollup` as before. User space sums both (otel_gpu/pipeline/launch_slots.py).
 *
 * Each CPU owns its LAUNCH_SLOTS entries; uprobe programs run with preemption disabled,
 * so one writer at a time touches an entry. User space reads the memory-mapped array
 * while it is written, so an entry changes owner only in this order: tgid = 0, func and
 * count, then the new tgid; user space reads tgid first (x86 keeps the order of stores
 * and of loads), so a nonzero tgid it reads comes with its own func and count, or with
 * the next owner's fields only when the old owner was already released, which user
 * space then skips (it reads only the processes it traces).
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
    if (s->tgid == tgid && s->func == func) {
        s->count++;
        return 1;
    }
    if ((s->tgid && pid_flags(s->tgid)) || !user_traced(tgid))
        return 0;
    s->tgid = 0;
    asm volatile("" ::: "memory"); /* keep the stores in this order (see above) */
    s->func = func;
    s->count = 1;
    asm volatile("" ::: "memory");
    s->tgid = tgid;
    return 1;
}
