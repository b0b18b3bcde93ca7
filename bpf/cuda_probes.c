/* CUDA runtime (libcudart) and driver (libcuda) uprobes. Entry-only wherever no
 * duration or return value is needed: a return probe roughly doubles the cost.
 * A call is streamed to user space while its process has HTTP activity, and
 * otherwise only counted in `rollup`. Argument registers follow the x86-64 SysV
 * ABI; see ARCHITECTURE.md for each signature. */
#include "maps.h"

/* Per-CPU: plain adds, no atomics on the hot path; user space sums the CPUs. */
BPF_PERCPU_HASH(rollup, struct rollup_key, struct rollup_value, 65536);

/* Set by user space once a libcuda is probed: only then is the runtime/driver
 * de-duplication state worth keeping (it costs a hash update per launch). */
BPF_ARRAY(driver_probed, u32, 1);

/* Calls with a return probe: entry state by thread. */
struct call_entry {
    u64 ts_ns;
    u64 arg0;
    u64 arg1;
    u32 call;
    u32 pad;
};
/* LRU: a thread that dies inside a call must not leak its entry forever. */
BPF_TABLE("lru_hash", u64, struct call_entry, in_call, 16384);

/* Last runtime launch per thread: a driver launch with the same grid and block
 * dims on the same thread soon after it is that launch passing through libcuda,
 * and is not counted twice. "Soon" is generous because the runtime may do slow
 * work first (lazy module loading on a kernel's first launch, initialisation). */
struct last_launch {
    u64 ts_ns;
    u32 grid[3];
    u32 block[3];
};
BPF_TABLE("lru_hash", u32, struct last_launch, last_rt_launch, 16384);
#define DRIVER_DEDUP_WINDOW_NS 10000000 /* 10 ms */

static __always_inline int cuda_admit(u32 tgid)
{
#if TRACE_ALL
    u32 one = 1;
    traced.lookup_or_try_init(&tgid, &one);
    return 1;
#else
    return is_traced(tgid);
#endif
}

static __always_inline int streaming(u32 tgid)
{
    s64 *active = http_active.lookup(&tgid);
    return active && *active > 0;
}

static __always_inline void rollup_add(u32 tgid, u32 call, u64 func, u64 bytes, u64 duration_ns)
{
    struct rollup_key k = {.tgid = tgid, .call = call, .func = func};
    struct rollup_value *v = rollup.lookup(&k);
    if (v) {
        v->count++;
        v->bytes += bytes;
        v->duration_ns += duration_ns;
    } else {
        struct rollup_value nv = {.count = 1, .bytes = bytes, .duration_ns = duration_ns};
        rollup.update(&k, &nv);
    }
}

static __always_inline void cuda_emit(struct cuda_event *e)
{
    if (streaming(e->h.tgid)) {
        count(CNT_CUDA_STREAMED);
        submit(e, sizeof(*e));
        return;
    }
    /* memcpy has no function: its direction takes that slot in the key. */
    u64 func = (e->call == CALL_MEMCPY || e->call == CALL_MEMCPY_ASYNC) ? e->kind : e->func;
    rollup_add(e->h.tgid, e->call, func, e->bytes, e->duration_ns);
}

static __always_inline int driver_is_probed(void)
{
    u32 zero = 0;
    u32 *on = driver_probed.lookup(&zero);
    return on && *on;
}

static __always_inline int cuda_begin(struct cuda_event *e, u32 call)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cuda_admit(id >> 32))
        return 0;
    fill_header(&e->h, EV_CUDA, id);
    e->call = call;
    e->ret = -1;
    return 1;
}

static __always_inline u64 stack_arg(struct pt_regs *ctx, int n)
{
    /* [sp] is the return address; the 7th integer argument is at [sp+8]. */
    u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
    return v;
}

static __always_inline void remember_rt_launch(struct cuda_event *e)
{
    struct last_launch l = {.ts_ns = e->h.ts_ns};
    __builtin_memcpy(l.grid, e->grid, sizeof(l.grid));
    __builtin_memcpy(l.block, e->block, sizeof(l.block));
    u32 tid = e->h.tid;
    last_rt_launch.update(&tid, &l);
}

/* cudaLaunchKernel(func, dim3 grid, dim3 block, void **args, size_t shmem, stream)
 * The hottest probe: outside requests it only counts (no stack reads, no event). */
int cuda_launch_kernel(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!cuda_admit(tgid))
        return 0;
    int stream_it = streaming(tgid), dedup = driver_is_probed();
    if (!stream_it && !dedup) {
        rollup_add(tgid, CALL_LAUNCH_KERNEL, PT_REGS_PARM1(ctx), 0, 0);
        return 0;
    }
    struct cuda_event e = {};
    fill_header(&e.h, EV_CUDA, id);
    e.call = CALL_LAUNCH_KERNEL;
    e.ret = -1;
    u64 gxy = PT_REGS_PARM2(ctx), bxy = PT_REGS_PARM4(ctx);
    e.func = PT_REGS_PARM1(ctx);
    e.grid[0] = (u32)gxy;
    e.grid[1] = gxy >> 32;
    e.grid[2] = (u32)PT_REGS_PARM3(ctx);
    e.block[0] = (u32)bxy;
    e.block[1] = bxy >> 32;
    e.block[2] = (u32)PT_REGS_PARM5(ctx);
    if (dedup)
        remember_rt_launch(&e);
    if (!stream_it) {
        rollup_add(tgid, CALL_LAUNCH_KERNEL, e.func, 0, 0);
        return 0;
    }
    e.shmem = stack_arg(ctx, 7);
    e.stream = stack_arg(ctx, 8);
    count(CNT_CUDA_STREAMED);
    submit(&e, sizeof(e));
    return 0;
}

/* Reads the 6 u32 dims, then shared memory and stream at offsets 24 and 32:
 * the layout shared by cudaLaunchConfig_t and CUlaunchConfig. */
static __always_inline void read_launch_config(struct cuda_event *e, u64 cfg)
{
    u32 dims[6] = {};
    bpf_probe_read_user(dims, sizeof(dims), (void *)cfg);
    e->grid[0] = dims[0];
    e->grid[1] = dims[1];
    e->grid[2] = dims[2];
    e->block[0] = dims[3];
    e->block[1] = dims[4];
    e->block[2] = dims[5];
    bpf_probe_read_user(&e->stream, sizeof(e->stream), (void *)(cfg + 32));
}

/* cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) */
int cuda_launch_kernel_exc(struct pt_regs *ctx)
{
    struct cuda_event e = {};
    if (!cuda_begin(&e, CALL_LAUNCH_KERNEL_EXC))
        return 0;
    read_launch_config(&e, PT_REGS_PARM1(ctx));
    bpf_probe_read_user(&e.shmem, sizeof(e.shmem), (void *)(PT_REGS_PARM1(ctx) + 24));
    e.func = PT_REGS_PARM2(ctx);
    if (driver_is_probed())
        remember_rt_launch(&e);
    cuda_emit(&e);
    return 0;
}

static __always_inline int driver_duplicate(struct cuda_event *e)
{
    u32 tid = e->h.tid;
    struct last_launch *l = last_rt_launch.lookup(&tid);
    if (!l || e->h.ts_ns - l->ts_ns > DRIVER_DEDUP_WINDOW_NS)
        return 0;
    /* Field by field: __builtin_memcmp does not lower to valid BPF here. */
    if (l->grid[0] != e->grid[0] || l->grid[1] != e->grid[1] || l->grid[2] != e->grid[2] ||
        l->block[0] != e->block[0] || l->block[1] != e->block[1] || l->block[2] != e->block[2])
        return 0;
    last_rt_launch.delete(&tid);
    count(CNT_DRIVER_DEDUPED);
    return 1;
}

/* cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) */
int cu_launch_kernel(struct pt_regs *ctx)
{
    struct cuda_event e = {};
    if (!cuda_begin(&e, CALL_CU_LAUNCH_KERNEL))
        return 0;
    e.func = PT_REGS_PARM1(ctx);
    e.grid[0] = PT_REGS_PARM2(ctx);
    e.grid[1] = PT_REGS_PARM3(ctx);
    e.grid[2] = PT_REGS_PARM4(ctx);
    e.block[0] = PT_REGS_PARM5(ctx);
    e.block[1] = PT_REGS_PARM6(ctx);
    e.block[2] = stack_arg(ctx, 7);
    e.shmem = (u32)stack_arg(ctx, 8);
    e.stream = stack_arg(ctx, 9);
    if (!driver_duplicate(&e))
        cuda_emit(&e);
    return 0;
}

/* cuLaunchKernelEx(const CUlaunchConfig *config, f, params, extra) */
int cu_launch_kernel_ex(struct pt_regs *ctx)
{
    struct cuda_event e = {};
    if (!cuda_begin(&e, CALL_CU_LAUNCH_KERNEL_EX))
        return 0;
    read_launch_config(&e, PT_REGS_PARM1(ctx));
    u32 shmem = 0;
    bpf_probe_read_user(&shmem, sizeof(shmem), (void *)(PT_REGS_PARM1(ctx) + 24));
    e.shmem = shmem;
    e.func = PT_REGS_PARM2(ctx);
    if (!driver_duplicate(&e))
        cuda_emit(&e);
    return 0;
}

/* cudaMemcpy(dst, src, count, kind) and cudaMemcpyAsync(..., stream) */
static __always_inline int memcpy_common(struct pt_regs *ctx, u32 call)
{
    struct cuda_event e = {};
    if (!cuda_begin(&e, call))
        return 0;
    e.bytes = PT_REGS_PARM3(ctx);
    e.kind = (u32)PT_REGS_PARM4(ctx);
    if (call == CALL_MEMCPY_ASYNC)
        e.stream = PT_REGS_PARM5(ctx);
    cuda_emit(&e);
    return 0;
}
int cuda_memcpy(struct pt_regs *ctx) { return memcpy_common(ctx, CALL_MEMCPY); }
int cuda_memcpy_async(struct pt_regs *ctx) { return memcpy_common(ctx, CALL_MEMCPY_ASYNC); }

/* cudaFree(ptr): entry only; user space matches the pointer to its cudaMalloc. */
int cuda_free(struct pt_regs *ctx)
{
    struct cuda_event e = {};
    if (!cuda_begin(&e, CALL_FREE))
        return 0;
    e.func = PT_REGS_PARM1(ctx);
    cuda_emit(&e);
    return 0;
}

/* cudaGraphLaunch(graphExec, stream) */
int cuda_graph_launch(struct pt_regs *ctx)
{
    struct cuda_event e = {};
    if (!cuda_begin(&e, CALL_GRAPH_LAUNCH))
        return 0;
    e.func = PT_REGS_PARM1(ctx);
    e.stream = PT_REGS_PARM2(ctx);
    cuda_emit(&e);
    return 0;
}

/* cudaSetDevice(device): the thread's current device. */
int cuda_set_device(struct pt_regs *ctx)
{
    struct cuda_event e = {};
    if (!cuda_begin(&e, CALL_SET_DEVICE))
        return 0;
    e.bytes = (u32)PT_REGS_PARM1(ctx);
    cuda_emit(&e);
    return 0;
}

/* Calls with a duration or a result: entry stashes, return emits. */
static __always_inline int call_enter(struct pt_regs *ctx, u32 call)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cuda_admit(id >> 32))
        return 0;
    struct call_entry c = {.ts_ns = bpf_ktime_get_ns(), .call = call,
                           .arg0 = PT_REGS_PARM1(ctx), .arg1 = PT_REGS_PARM2(ctx)};
    in_call.update(&id, &c);
    return 0;
}

int cuda_malloc_enter(struct pt_regs *ctx) { return call_enter(ctx, CALL_MALLOC); }
int cuda_stream_sync_enter(struct pt_regs *ctx) { return call_enter(ctx, CALL_STREAM_SYNC); }
int cuda_device_sync_enter(struct pt_regs *ctx) { return call_enter(ctx, CALL_DEVICE_SYNC); }
int cuda_event_sync_enter(struct pt_regs *ctx) { return call_enter(ctx, CALL_EVENT_SYNC); }

int cuda_call_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct call_entry *c = in_call.lookup(&id);
    if (!c)
        return 0;
    struct cuda_event e = {};
    fill_header(&e.h, EV_CUDA, id);
    e.call = c->call;
    e.ret = (s32)PT_REGS_RC(ctx);
    e.h.ts_ns = c->ts_ns;
    e.duration_ns = bpf_ktime_get_ns() - c->ts_ns;
    if (c->call == CALL_MALLOC) {
        /* cudaMalloc(void **devPtr, size_t size): the pointer exists at return. */
        bpf_probe_read_user(&e.func, sizeof(e.func), (void *)c->arg0);
        e.bytes = c->arg1;
    } else {
        e.stream = c->call == CALL_DEVICE_SYNC ? 0 : c->arg0; /* stream or event handle */
    }
    in_call.delete(&id);
    cuda_emit(&e);
    return 0;
}
