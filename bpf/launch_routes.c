/* Where a runtime launch is counted. On a GPU, cudaLaunchKernel calls the driver's
 * cuLaunchKernel from libcudart's code: with both probed, one launch runs two programs
 * (two traps). So, per process, the runtime's launch probes are attached while they are
 * needed and detached after (otel_gpu/probes/launch_routes.py); the driver's probe
 * (cuda_probes.c) then counts the launch in the runtime's name, exactly, by these rules:
 *
 * - Every run of a runtime launch probe marks its thread (`launch_marks`, a bit per
 *   thread id in an inlined array). Every driver launch probe takes its thread's mark
 *   first thing, so a mark never outlives the launch that made it, wherever the
 *   launch ends.
 * - A driver launch called from the runtime's code (`runtime_text`: its return address
 *   lies in a libcudart mapping the scan found) with the mark: the runtime's probe has
 *   counted it; dropped (driver_deduped). Without the mark: the runtime's probe did not
 *   run; counted here as the runtime call (driver_as_runtime).
 * - A driver launch from anywhere else (cuBLAS, Triton, NCCL) is a launch of its own.
 *
 * Attaching or detaching a runtime probe in the middle of a launch is exact either way:
 * the mark says whether its program ran. The one launch that is not exact: one failing
 * inside libcudart before it reaches the driver (so its mark stays) right before that
 * process's runtime probes go; that thread's next launch through the runtime is then
 * dropped as counted. The count stays equal (the failed call was counted in its place);
 * one launch's dims and kernel are the failed call's.
 *
 * Kernel names: the runtime names a kernel by its host stub (func), the driver by a
 * handle. While a process's runtime probes are attached, learner programs on the same
 * entries (runtime_launch_learn*) keep each thread's func (`launch_funcs`), and the driver
 * probe that takes a mark pairs its handle with it (`launch_pairs`). A launch counted at
 * the driver carries its paired func, or its handle where none is paired yet (user
 * space names it from what the handle probes learned, and attaches the runtime probes
 * again: `launch_routes` counts pairs, unpaired launches, the learners' runs and graph
 * launches seen reaching the driver per process). Graph launches need no pair: one seen
 * reaching the driver's probe is enough for user space to detach the runtime's graph
 * launch probes. */
#include "maps.h"

/* Exact runtime/driver de-duplication: per process, the executable mappings of its CUDA
 * runtime (each libcudart, or the executable with cudart linked in), written by user
 * space at each scan (otel_gpu/probes/runtime_text.py). */
#define RUNTIME_RANGES 4
struct runtime_text {
    u64 lo[RUNTIME_RANGES];
    u64 hi[RUNTIME_RANGES]; /* exclusive; lo == hi: unused */
};
BPF_HASH(runtime_text, u32, struct runtime_text, MAX_PROCS);

/* A bit per thread id, for the ids pid_max allowed at start (PID_WORDS * 32; ids past it
 * have no mark and their driver launches from the runtime are dropped as before): 512 KB
 * at the largest pid_max. A word holds 64 threads' bits: set and cleared atomically, and
 * only when they change (a runtime launch whose mark no driver takes, as where no driver
 * exists, reads its word and writes nothing). */
BPF_ARRAY(launch_marks, u64, (PID_WORDS + 1) / 2);

struct launch_pair_key {
    u32 tgid;
    u32 pad;
    u64 handle;
};
/* handle -> the runtime's func, per process; LRU: a process's kernels come and go. */
BPF_TABLE("lru_hash", struct launch_pair_key, u64, launch_pairs, 16384);

/* A direct-mapped cache in front of launch_pairs, read first by every unmarked driver
 * launch: an inlined array read (~5 ns here) where the hash lookup of a 16-byte key costs
 * ~26 ns, a quarter of the driver probe's run. launch_pairs stays the truth: a slot is
 * filled from it on a miss and rewritten where a pair is learned, and user space clears a
 * process's slots with its pairs (probes/launch_routes.py). Slots are written by several
 * CPUs without a lock: `check` mixes the other three fields, so a slot read while another
 * CPU writes it (fields of two pairs) is a miss, not a wrong func. Two kernels sharing a
 * slot only cost the hash lookup, never a pair. */
#define PAIR_CACHE_BITS 12
struct launch_pair_slot {
    u64 handle;
    u64 func;
    u32 tgid;
    u32 check;
};
BPF_ARRAY(launch_pair_cache, struct launch_pair_slot, 1 << PAIR_CACHE_BITS);

static __always_inline u32 pair_check(u32 tgid, u64 handle, u64 func)
{
    return ((handle ^ (func * FIB_MIX) ^ tgid) * FIB_MIX) >> 32;
}

static __always_inline struct launch_pair_slot *pair_slot(u32 tgid, u64 handle)
{
    u32 i = ((handle ^ ((u64)tgid << 40)) * FIB_MIX) >> (64 - PAIR_CACHE_BITS);
    return launch_pair_cache.lookup(&i);
}

static __always_inline void pair_cache_put(struct launch_pair_slot *slot, u32 tgid, u64 handle, u64 func)
{
    if (!slot)
        return;
    slot->handle = handle;
    slot->func = func;
    slot->tgid = tgid;
    slot->check = pair_check(tgid, handle, func);
}

/* The func paired with `handle` in process `tgid`: 1 and *func set, or 0. */
static __always_inline int pair_of(u32 tgid, u64 handle, u64 *func)
{
    struct launch_pair_slot *slot = pair_slot(tgid, handle);
    if (slot && slot->handle == handle && slot->tgid == tgid) {
        u64 f = slot->func;
        if (slot->check == pair_check(tgid, handle, f)) {
            *func = f;
            return 1;
        }
    }
    struct launch_pair_key k = {.tgid = tgid, .handle = handle};
    u64 *paired = launch_pairs.lookup(&k);
    if (!paired)
        return 0;
    *func = *paired;
    pair_cache_put(slot, tgid, handle, *func);
    return 1;
}
/* Thread id -> the func of its runtime launch in flight, kept only by the learner programs. */
BPF_TABLE("lru_hash", u32, u64, launch_funcs, 4096);
/* Processes whose learners are attached (written by user space before it attaches them,
 * deleted before it detaches them): a func kept by a learner run that no driver pass took
 * (a launch that failed first) is never paired once they go. */
BPF_HASH(launch_learning, u32, u8, MAX_PROCS);

struct launch_route {
    u64 paired;    /* handle and func pairs learned */
    u64 unpaired;  /* launches counted at the driver whose handle had no pair */
    u64 kept;      /* funcs the learners kept: launches seen while learning */
    u64 graphs;    /* runtime graph launches seen reaching the driver's probe while
                    * learning: they need no pair (the exec is the same handle for both) */
};
BPF_F_TABLE("hash", u32, struct launch_route, launch_routes, MAX_PROCS, BY_NEED);

enum driver_route { DRIVER_OWN, DRIVER_DROP, DRIVER_AS_RUNTIME };

/* A runtime launch probe's first act. */
static __always_inline void launch_mark(u64 id)
{
    u32 tid = (u32)id, word = tid >> 6;
    u64 bit = 1ULL << (tid & 63);
    u64 *m = launch_marks.lookup(&word);
    if (m && !(*m & bit))
        __sync_fetch_and_or(m, bit);
}

/* A driver launch probe's first act: 1 marked (and cleared), 0 not, -1 no mark kept. */
static __always_inline int launch_mark_take(u64 id)
{
    u32 tid = (u32)id, word = tid >> 6;
    u64 bit = 1ULL << (tid & 63);
    u64 *m = launch_marks.lookup(&word);
    if (!m)
        return -1;
    if (!(*m & bit))
        return 0;
    __sync_fetch_and_and(m, ~bit);
    return 1;
}

static __always_inline struct launch_route *route_of(u32 tgid)
{
    struct launch_route *r = launch_routes.lookup(&tgid);
    if (r)
        return r;
    struct launch_route zero = {};
    launch_routes.insert(&tgid, &zero); /* fails when another CPU made it meanwhile */
    return launch_routes.lookup(&tgid);
}

/* The learner's func for this thread's launch, paired with the driver's handle. */
static __always_inline void launch_pair_learn(u64 id, u64 handle)
{
    u32 tid = (u32)id, tgid = id >> 32;
    if (!launch_learning.lookup(&tgid))
        return;
    u64 *func = launch_funcs.lookup(&tid);
    if (!func)
        return;
    struct launch_pair_key k = {.tgid = id >> 32, .handle = handle};
    u64 *known = launch_pairs.lookup(&k);
    if (!known || *known != *func) {
        launch_pairs.update(&k, func);
        pair_cache_put(pair_slot(k.tgid, handle), k.tgid, handle, *func);
        struct launch_route *r = route_of(k.tgid);
        if (r)
            __sync_fetch_and_add(&r->paired, 1);
    }
    launch_funcs.delete(&tid);
}

/* A runtime graph launch of tgid dropped at the driver's probe as counted: while tgid
 * learns, its graph launches are known to reach that probe. */
static __always_inline void graph_launch_reached(u32 tgid)
{
    if (!launch_learning.lookup(&tgid))
        return;
    struct launch_route *r = route_of(tgid);
    if (r)
        __sync_fetch_and_add(&r->graphs, 1);
}

/* At a driver entry point's first instruction ([sp]: its return address): 1 when its
 * caller is the process's CUDA runtime. Before user space has read the process's mappings
 * (its first scan) the caller is unknown: 0, counted as driver_caller_unknown. */
static __always_inline int from_runtime(struct pt_regs *ctx, u32 tgid)
{
    struct runtime_text *t = runtime_text.lookup(&tgid);
    u64 ret = 0;
    if (!t || bpf_probe_read_user(&ret, sizeof(ret), (void *)PT_REGS_SP(ctx)) < 0) {
        count(CNT_DRIVER_CALLER_UNKNOWN);
        return 0;
    }
    int found = 0;
#pragma unroll
    for (int i = 0; i < RUNTIME_RANGES; i++)
        found |= ret >= t->lo[i] && ret < t->hi[i];
    return found;
}

/* The rules above for a driver launch of `handle` by a traced process; `marked`: what
 * launch_mark_take said; `func`: set for DRIVER_AS_RUNTIME, the launch's func (its pair,
 * else the handle itself). Reading the return address costs ~50 ns here (a user memory
 * read), half the driver probe's run: an unmarked launch of a paired handle is taken for
 * the runtime's without it. So a library's own driver launch of a handle the runtime
 * launched too would count as the runtime's call: the count stays equal, its name is the
 * runtime's. */
static __always_inline int driver_route(struct pt_regs *ctx, u64 id, int marked, u64 handle, u64 *func)
{
    u32 tgid = id >> 32;
    if (marked) { /* 1, or -1: no mark kept for this thread (dropped, as before marks) */
        if (!from_runtime(ctx, tgid))
            return DRIVER_OWN;
        count(CNT_DRIVER_DEDUPED);
        if (marked > 0)
            launch_pair_learn(id, handle);
        return DRIVER_DROP;
    }
    if (!pair_of(tgid, handle, func)) {
        if (!from_runtime(ctx, tgid))
            return DRIVER_OWN;
        struct launch_route *r = route_of(tgid);
        if (r)
            __sync_fetch_and_add(&r->unpaired, 1);
        *func = handle;
    }
    count(CNT_DRIVER_AS_RUNTIME);
    return DRIVER_AS_RUNTIME;
}

/* The learners: attached beside the runtime's launch probes while a process's pairs are
 * learned. cudaLaunchKernel(func, ...) and cudaLaunchKernelExC(config, func, args). */
static __always_inline int launch_func_keep(u64 func)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tid = (u32)id;
    launch_funcs.update(&tid, &func);
    struct launch_route *r = route_of(id >> 32);
    if (r)
        __sync_fetch_and_add(&r->kept, 1);
    return 0;
}
int runtime_launch_learn(struct pt_regs *ctx) { return launch_func_keep(PT_REGS_PARM1(ctx)); }
int runtime_launch_exc_learn(struct pt_regs *ctx) { return launch_func_keep(PT_REGS_PARM2(ctx)); }
