/* Item 1 breakdown: the steps of bpf/cuda_probes.c's cuda_launch_kernel, cumulated
 * one handler at a time, so each step's cost per launch can be measured. Loaded
 * by bench/item_ablation.py after bpf/maps.h (same maps, helpers and -D flags).
 * A copy for measurement only: the product's handlers stay in bpf/. */

struct v_last_launch {
    u64 ts_ns;
    u32 grid[3];
    u32 block[3];
};
BPF_HASH(v_last, u32, struct v_last_launch, 16384);
BPF_HASH(v_rollup, struct rollup_key, struct rollup_value, 65536);
BPF_PERCPU_HASH(v_rollup_pc, struct rollup_key, struct rollup_value, 65536);

#define STEP_EMPTY 0
#define STEP_ADMIT 1     /* pid_tgid, traced lookup, header (ktime), registers */
#define STEP_STACK 2     /* + two bpf_probe_read_user of stack arguments */
#define STEP_REMEMBER 3  /* + last_rt_launch hash update (driver dedup) */
#define STEP_FULL 4      /* + counter, http_active lookup, rollup lookup + 3 atomics */

static __always_inline u64 v_stack_arg(struct pt_regs *ctx, int n)
{
    u64 v = 0;
    bpf_probe_read_user(&v, sizeof(v), (void *)(PT_REGS_SP(ctx) + 8 * (n - 6)));
    return v;
}

static __always_inline void v_rollup_add(struct launch_event *e, int percpu)
{
    struct rollup_key k = {.tgid = e->c.h.tgid, .call = e->c.call, .detail = e->func};
    struct rollup_value *v = percpu ? v_rollup_pc.lookup(&k) : v_rollup.lookup(&k);
    if (v && percpu) {
        v->count += 1;
    } else if (v) {
        __sync_fetch_and_add(&v->count, 1);
        __sync_fetch_and_add(&v->bytes, 0);
        __sync_fetch_and_add(&v->duration_ns, 0);
    } else {
        struct rollup_value nv = {.count = 1};
        if (percpu)
            v_rollup_pc.update(&k, &nv);
        else
            v_rollup.update(&k, &nv);
    }
}

/* step: how far to go; remember: do the dedup update; percpu: per-CPU rollup,
 * plain adds; wake: ring-buffer flags when streaming (0 or BPF_RB_NO_WAKEUP). */
static __always_inline int v_launch(struct pt_regs *ctx, int step, int remember, int percpu, u64 wake)
{
    if (step == STEP_EMPTY)
        return 0;
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_traced(tgid))
        return 0;
    struct launch_event e = {};
    fill_header(&e.c.h, EV_CUDA_LAUNCH, id);
    e.c.call = CALL_LAUNCH_KERNEL;
    e.c.ret = -1;
    u64 gxy = PT_REGS_PARM2(ctx), bxy = PT_REGS_PARM4(ctx);
    e.func = PT_REGS_PARM1(ctx);
    e.dims.grid[0] = (u32)gxy;
    e.dims.grid[1] = gxy >> 32;
    e.dims.grid[2] = (u32)PT_REGS_PARM3(ctx);
    e.dims.block[0] = (u32)bxy;
    e.dims.block[1] = bxy >> 32;
    e.dims.block[2] = (u32)PT_REGS_PARM5(ctx);
    if (step >= STEP_STACK) {
        e.shmem = v_stack_arg(ctx, 7);
        e.stream = v_stack_arg(ctx, 8);
    }
    if (step >= STEP_REMEMBER && remember) {
        struct v_last_launch l = {.ts_ns = e.c.h.ts_ns};
        __builtin_memcpy(l.grid, e.dims.grid, sizeof(l.grid));
        __builtin_memcpy(l.block, e.dims.block, sizeof(l.block));
        u32 tid = e.c.h.tid;
        v_last.update(&tid, &l);
    }
    if (step < STEP_FULL)
        return e.c.h.ts_ns == 0; /* keeps the work above */
    s64 *active = http_active.lookup(&tgid);
    if (active && *active > 0) {
        count(CNT_CUDA_STREAMED);
        if (events.ringbuf_output(&e, sizeof(e), wake) != 0)
            count(CNT_RINGBUF_FULL);
        return 0;
    }
    count(CNT_CUDA_STREAMED); /* the old handler counted here too: same cost */
    v_rollup_add(&e, percpu);
    return 0;
}

int v_empty(struct pt_regs *ctx) { return v_launch(ctx, STEP_EMPTY, 1, 0, 0); }
int v_admit(struct pt_regs *ctx) { return v_launch(ctx, STEP_ADMIT, 1, 0, 0); }
int v_stack(struct pt_regs *ctx) { return v_launch(ctx, STEP_STACK, 1, 0, 0); }
int v_remember(struct pt_regs *ctx) { return v_launch(ctx, STEP_REMEMBER, 1, 0, 0); }
int v_full(struct pt_regs *ctx) { return v_launch(ctx, STEP_FULL, 1, 0, 0); }
int v_full_no_remember(struct pt_regs *ctx) { return v_launch(ctx, STEP_FULL, 0, 0, 0); }
int v_full_percpu(struct pt_regs *ctx) { return v_launch(ctx, STEP_FULL, 1, 1, 0); }
int v_lean(struct pt_regs *ctx) { return v_launch(ctx, STEP_FULL, 0, 1, 0); }
int v_stream(struct pt_regs *ctx) { return v_launch(ctx, STEP_FULL, 1, 0, 0); }
int v_stream_no_wakeup(struct pt_regs *ctx) { return v_launch(ctx, STEP_FULL, 1, 0, BPF_RB_NO_WAKEUP); }
