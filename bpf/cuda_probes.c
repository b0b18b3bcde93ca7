/* CUDA runtime (libcudart) and driver (libcuda) uprobes. Entry-only wherever no
 * duration or return value is needed: a return probe roughly doubles the cost. Each
 * handler fills its call's record and hands it to bpf/call_out.c (cuda_emit): streamed,
 * counted per request, or counted in rollup.
 *
 * ABI (x86-64 SysV, at function entry): integer arguments 1-6 in di, si, dx, cx,
 * r8, r9 (PT_REGS_PARM1..6); [sp] is the return address, argument 7 is at [sp+8],
 * 8 at [sp+16] (stack_args). A dim3 passed by value takes two registers: x|y<<32,
 * then z. So cudaLaunchKernel(func, grid, block, args, shmem, stream) is di=func,
 * si/dx=grid, cx/r8=block, r9=args, [sp+8]=shmem, [sp+16]=stream. Out-pointers
 * (cudaMalloc's void **) are read at return. Each handler names its signature. */
#include "maps.h"

/* Calls with a return probe: entry state by thread. */
struct call_entry {
    u64 ts_ns;
    u64 arg0;
    u64 arg1;
    u32 call;
    u32 tv;  /* the process's traced value at entry */
};
/* LRU: a thread that dies inside a call must not leak its entry forever. */
BPF_TABLE("lru_hash", u64, struct call_entry, in_call, 16384);

/* Reads from the traced process's memory: a failed read leaves zeros and marks the
 * record (EV_FLAG_UNREADABLE), so user space never takes the zeros for real values. */
static __always_inline void read_user(void *dst, u32 size, const void *src, u8 *flags)
{
    if (bpf_probe_read_user(dst, size, src) < 0)  /* the helper zeroes dst on failure */
        *flags |= EV_FLAG_UNREADABLE;
}

/* Arguments 7 .. 6+n (n a constant) in one read: they lie side by side in the caller's
 * frame, and each user-memory read costs ~50 ns here (a streamed launch read three).
 * [sp] is the return address; the 7th integer argument is at [sp+8]. */
static __always_inline void stack_args(struct pt_regs *ctx, u64 *out, u32 n, u8 *flags)
{
    read_user(out, n * sizeof(u64), (void *)(PT_REGS_SP(ctx) + 8), flags);
}

/* The 7th argument alone. */
static __always_inline u64 stack_arg7(struct pt_regs *ctx, u8 *flags)
{
    u64 v = 0;
    stack_args(ctx, &v, 1, flags);
    return v;
}

/* A dim3 by value takes two registers (x|y<<32, then z): cudaLaunchKernel's grid and
 * block (si/dx, cx/r8), hipLaunchKernel's too. */
static __always_inline void runtime_dims(struct pt_regs *ctx, struct launch_dims *d)
{
    u64 gxy = PT_REGS_PARM2(ctx), bxy = PT_REGS_PARM4(ctx);
    d->grid[0] = (u32)gxy;
    d->grid[1] = gxy >> 32;
    d->grid[2] = (u32)PT_REGS_PARM3(ctx);
    d->block[0] = (u32)bxy;
    d->block[1] = bxy >> 32;
    d->block[2] = (u32)PT_REGS_PARM5(ctx);
}

/* A launch with cuLaunchKernel's layout: (f, gx, gy, gz, bx, by, bz, shmem, stream, params,
 * extra); hipModuleLaunchKernel's too. `global_size`: the grid is given in threads
 * (hipExtModuleLaunchKernel), and the record's grid is it over the block, as the runtime
 * computes it. */
static __always_inline void driver_dims(struct pt_regs *ctx, struct launch_event *e, int global_size)
{
    e->dims.grid[0] = PT_REGS_PARM2(ctx);
    e->dims.grid[1] = PT_REGS_PARM3(ctx);
    e->dims.grid[2] = PT_REGS_PARM4(ctx);
    e->dims.block[0] = PT_REGS_PARM5(ctx);
    e->dims.block[1] = PT_REGS_PARM6(ctx);
    u64 a[3];  /* bz, shmem, stream */
    stack_args(ctx, a, 3, &e->c.h.flags);
    e->dims.block[2] = a[0];
    e->shmem = (u32)a[1];
    e->stream = a[2];
    if (global_size) {
#pragma unroll
        for (int i = 0; i < 3; i++)
            e->dims.grid[i] = e->dims.block[i] ? e->dims.grid[i] / e->dims.block[i] : 0;
    }
}

/* A cudaLaunchKernel of `func`: at its own probe (dims from its registers), or counted at
 * the driver's probe in its place (`at_driver`: dims in cuLaunchKernel's layout;
 * launch_routes.c). The hottest path: outside requests it only counts (no stack reads, no
 * event). */
static __always_inline int runtime_launch(struct pt_regs *ctx, u64 id, u64 func, int at_driver, u64 flags)
{
    u32 tgid = id >> 32;
    /* The common case, a traced process that has never had HTTP activity and follows no
     * server, with nothing capturing: told from its pid bits (`flags`: maps.h pid_flags,
     * three inlined array reads) and counted in its launch slot, with no hash lookup while
     * it has one. */
    int any_capture = captures_any();
    if (flags == PID_TRACED && !any_capture) {
        if (!launch_slot_add(tgid, func))
            rollup_add(tgid, CALL_LAUNCH_KERNEL, func, 0, 0);
        return 0;
    }
    /* Inside a request, a thread past its budget (a decode loop's steady state): counted
     * under its standing verdict (bpf/request_counts.c), with one lookup. */
    if (flags == (PID_TRACED | PID_SLOW) && !any_capture) {
        struct verdict_held held;
        if (standing_verdict(tgid, id, &held)) {
            struct cuda_header c = {.call = CALL_LAUNCH_KERNEL, .ret = -1};
            fill_header(&c.h, EV_CUDA_LAUNCH, id);
            counted_add(&c, &held, func, 0, 0);
            return 0;
        }
    }
    u32 tv = cuda_admit(tgid);
    if (!tv)
        return 0;
    int capture = capturing(tgid);
    if (!capture && !streaming(tgid, tv)) {
        rollup_add(tgid, CALL_LAUNCH_KERNEL, func, 0, 0);
        return 0;
    }
    struct launch_event e = {};
    fill_header(&e.c.h, EV_CUDA_LAUNCH, id);
    e.c.call = CALL_LAUNCH_KERNEL;
    e.c.ret = -1;
    e.func = func;
    /* Inside a request past its budget (an LLM decode loop's steady state) the launch is
     * only counted: decided before the dims and the two stack reads. */
    struct http_seq *s = 0;
    if (!capture && !stream_admit(&e.c, tv, &s, e.func, 0, 0))
        return 0;
    if (at_driver) {
        driver_dims(ctx, &e, 0);
    } else {
        runtime_dims(ctx, &e.dims);
        u64 a[2];  /* shmem, stream */
        stack_args(ctx, a, 2, &e.c.h.flags);
        e.shmem = a[0];
        e.stream = a[1];
    }
    if (capture)
        capture_emit(&e.c, sizeof(e));  /* recorded into a graph, or run: user space decides */
    else
        stream_out(&e.c, sizeof(e), s, e.func, 0, 0);
    return 0;
}

/* cudaLaunchKernel(func, dim3 grid, dim3 block, void **args, size_t shmem, stream) */
int cuda_launch_kernel(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    launch_mark(id);
    return runtime_launch(ctx, id, PT_REGS_PARM1(ctx), 0, pid_flags(id >> 32));
}

/* cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) */
int cuda_launch_kernel_exc(struct pt_regs *ctx)
{
    launch_mark(bpf_get_current_pid_tgid());
    struct launch_event e = {};
    u32 tv = cuda_begin(&e.c, EV_CUDA_LAUNCH, CALL_LAUNCH_KERNEL_EXC);
    if (!tv)
        return 0;
    struct user_launch_config cfg = {};
    read_user(&cfg, sizeof(cfg), (void *)PT_REGS_PARM1(ctx), &e.c.h.flags);
    e.dims = cfg.dims;
    e.shmem = cfg.dynamic_smem_bytes;
    e.stream = cfg.stream;
    e.func = PT_REGS_PARM2(ctx);
    EMIT(e, tv, e.func, 0, 0);
    return 0;
}

/* A launch with cuLaunchKernel's layout, the driver's own (from the driver's probe) or
 * HIP's. */
static __always_inline int driver_layout_launch(struct pt_regs *ctx, u32 call, int global_size)
{
    struct launch_event e = {};
    u32 tv = cuda_begin(&e.c, EV_CUDA_LAUNCH, call);
    if (!tv)
        return 0;
    e.func = PT_REGS_PARM1(ctx);
    driver_dims(ctx, &e, global_size);
    EMIT(e, tv, e.func, 0, 0);
    return 0;
}

/* A driver launch probe's start (launch_routes.c): its thread's mark taken, then, for a
 * traced process, where the launch counts. The pid bits first (*flags, for
 * runtime_launch): a traced process pays no hash lookup to be told so. */
static __always_inline int driver_launch_route(struct pt_regs *ctx, u64 id, u64 handle, u64 *func, u64 *flags)
{
    int marked = launch_mark_take(id);
    u32 tgid = id >> 32;
    *flags = pid_flags(tgid);
    if (!(*flags & PID_TRACED) && !cuda_admit(tgid))
        return DRIVER_DROP;
    return driver_route(ctx, id, marked, handle, func);
}

/* cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra) */
int cu_launch_kernel(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid(), f = PT_REGS_PARM1(ctx), func = 0, flags;
    int route = driver_launch_route(ctx, id, f, &func, &flags);
    if (route == DRIVER_AS_RUNTIME)
        return runtime_launch(ctx, id, func, 1, flags);
    return route == DRIVER_OWN ? driver_layout_launch(ctx, CALL_CU_LAUNCH_KERNEL, 0) : 0;
}

/* cuLaunchKernelEx(const CUlaunchConfig *config, f, params, extra); from the runtime, a
 * cudaLaunchKernelExC. */
int cu_launch_kernel_ex(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid(), f = PT_REGS_PARM2(ctx), func = 0, flags;
    int route = driver_launch_route(ctx, id, f, &func, &flags);
    if (route == DRIVER_DROP)
        return 0;
    struct launch_event e = {};
    int as_runtime = route == DRIVER_AS_RUNTIME;
    u32 tv = cuda_begin(&e.c, EV_CUDA_LAUNCH, as_runtime ? CALL_LAUNCH_KERNEL_EXC : CALL_CU_LAUNCH_KERNEL_EX);
    if (!tv)
        return 0;
    struct user_launch_config cfg = {};
    read_user(&cfg, sizeof(cfg), (void *)PT_REGS_PARM1(ctx), &e.c.h.flags);
    e.dims = cfg.dims;
    e.shmem = cfg.shared_mem_bytes;
    e.stream = cfg.stream;
    e.func = as_runtime ? func : f;
    EMIT(e, tv, e.func, 0, 0);
    return 0;
}

static __always_inline int memcpy_emit(u32 call, u64 bytes, u64 direction, u64 stream, u8 flags)
{
    struct memcpy_event e = {};
    u32 tv = cuda_begin(&e.c, EV_CUDA_MEMCPY, call);
    if (!tv)
        return 0;
    e.c.h.flags = flags;
    e.bytes = bytes;
    e.direction = (u32)direction;
    e.stream = stream;
    EMIT(e, tv, e.direction, e.bytes, 0);
    return 0;
}

/* cudaMemcpy(dst, src, count, kind) */
int cuda_memcpy(struct pt_regs *ctx)
{
    return memcpy_emit(CALL_MEMCPY, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, 0);
}

/* cudaMemcpyAsync(dst, src, count, kind, stream) */
int cuda_memcpy_async(struct pt_regs *ctx)
{
    return memcpy_emit(CALL_MEMCPY_ASYNC, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), 0);
}

/* cudaMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream):
 * width bytes by height rows (hipMemcpy2DAsync's layout too). */
static __always_inline int memcpy_2d_emit(struct pt_regs *ctx, u32 call)
{
    u8 flags = 0;
    u64 a[2];  /* kind, stream */
    stack_args(ctx, a, 2, &flags);
    return memcpy_emit(call, PT_REGS_PARM5(ctx) * PT_REGS_PARM6(ctx), a[0], a[1], flags);
}
int cuda_memcpy_2d_async(struct pt_regs *ctx) { return memcpy_2d_emit(ctx, CALL_MEMCPY_2D_ASYNC); }

/* One argument says it all: a freed pointer (cudaFree(ptr); user space matches it to its
 * allocation), a graph launch (cudaGraphLaunch(graphExec, stream); its pass through the
 * driver's cuGraphLaunch is dropped there: bpf/graph_probes.c), the thread's current device
 * (cudaSetDevice(int device)). Entry only. */
static __always_inline int free_emit(struct pt_regs *ctx, u32 call)
{
    struct memory_event e = {};
    u32 tv = cuda_begin(&e.c, EV_CUDA_MEMORY, call);
    if (!tv)
        return 0;
    e.ptr = PT_REGS_PARM1(ctx);
    EMIT(e, tv, e.ptr, 0, 0);
    return 0;
}

static __always_inline int graph_launch_emit(struct pt_regs *ctx, u32 call)
{
    struct graph_event e = {};
    u32 tv = cuda_begin(&e.c, EV_CUDA_GRAPH, call);
    if (!tv)
        return 0;
    e.graph_exec = PT_REGS_PARM1(ctx);
    e.stream = PT_REGS_PARM2(ctx);
    EMIT(e, tv, e.graph_exec, 0, 0);
    return 0;
}

static __always_inline int set_device_emit(struct pt_regs *ctx, u32 call)
{
    struct device_event e = {};
    u32 tv = cuda_begin(&e.c, EV_CUDA_DEVICE, call);
    if (!tv)
        return 0;
    e.device = (u32)PT_REGS_PARM1(ctx);
    EMIT(e, tv, e.device, 0, 0);
    return 0;
}

int cuda_free(struct pt_regs *ctx) { return free_emit(ctx, CALL_FREE); }
int cuda_graph_launch(struct pt_regs *ctx)
{
    launch_mark(bpf_get_current_pid_tgid()); /* its pass through cuGraphLaunch: bpf/graph_probes.c */
    return graph_launch_emit(ctx, CALL_GRAPH_LAUNCH);
}
int cuda_set_device(struct pt_regs *ctx) { return set_device_emit(ctx, CALL_SET_DEVICE); }

/* Calls with a duration or a result: entry stashes (arg0: the stream or event a sync waits
 * for, 0 for the whole device; the out-pointer of an allocation, arg1 its size), return emits. */
static __always_inline int call_enter(u32 call, u64 arg0, u64 arg1)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tv = cuda_admit(id >> 32);
    if (!tv)
        return 0;
    struct call_entry c = {.ts_ns = bpf_ktime_get_ns(), .call = call, .tv = tv, .arg0 = arg0, .arg1 = arg1};
    in_call.update(&id, &c);
    return 0;
}

/* cudaMalloc(void **devPtr, size_t size) */
int cuda_malloc_enter(struct pt_regs *ctx) { return call_enter(CALL_MALLOC, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); }
/* cudaStreamSynchronize(stream), cudaDeviceSynchronize(), cudaEventSynchronize(event) */
int cuda_stream_sync_enter(struct pt_regs *ctx) { return call_enter(CALL_STREAM_SYNC, PT_REGS_PARM1(ctx), 0); }
int cuda_device_sync_enter(struct pt_regs *ctx) { return call_enter(CALL_DEVICE_SYNC, 0, 0); }
int cuda_event_sync_enter(struct pt_regs *ctx) { return call_enter(CALL_EVENT_SYNC, PT_REGS_PARM1(ctx), 0); }

/* Fills the common part at return: the entry's timestamp, the return code. */
static __always_inline void returned(struct cuda_header *h, u8 kind, u64 id, struct call_entry *c,
                                     struct pt_regs *ctx)
{
    fill_header(&h->h, kind, id);
    h->h.ts_ns = c->ts_ns;
    h->call = c->call;
    h->ret = (s32)PT_REGS_RC(ctx);
}

int cuda_call_return(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct call_entry *c = in_call.lookup(&id);
    if (!c)
        return 0;
    u64 duration_ns = bpf_ktime_get_ns() - c->ts_ns;
    u32 tv = c->tv; /* read before the entry is deleted */
    if (CALL_IS_ALLOC(c->call)) {
        struct memory_event e = {};
        returned(&e.c, EV_CUDA_MEMORY, id, c, ctx);
        /* The pointer exists at return: *devPtr. */
        read_user(&e.ptr, sizeof(e.ptr), (void *)c->arg0, &e.c.h.flags);
        e.bytes = c->arg1;
        e.duration_ns = duration_ns;
        in_call.delete(&id);
        EMIT(e, tv, e.ptr, e.bytes, duration_ns);
    } else {
        struct sync_event e = {};
        returned(&e.c, EV_CUDA_SYNC, id, c, ctx);
        e.handle = c->arg0; /* stream or event; 0: the device */
        e.duration_ns = duration_ns;
        in_call.delete(&id);
        EMIT(e, tv, 0, 0, duration_ns);
    }
    return 0;
}
