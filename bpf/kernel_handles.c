/* Kernel handles and what they name (after cuda_probes.c, whose helpers it uses).
 * Calls that hand out a kernel handle (CUfunction, CUkernel, cudaKernel_t) through an
 * out-parameter: entry keeps the out-pointer and the name or source, return reads the
 * handle and sends one kernel_handle_event. Once per kernel, so always sent. Keyed by
 * thread and call: __cudaGetKernel may call cuLibraryGetKernel inside (nested). */
#include "maps.h"

struct handle_call_key {
    u64 pid_tgid;
    u32 call;
    u32 pad;
};
struct handle_call {
    u64 out;     /* where the handle is written */
    u64 source;  /* host stub or CUkernel the handle stands for; 0: a name */
    u64 name;    /* const char * of the name; 0: a source */
};
BPF_TABLE("lru_hash", struct handle_call_key, struct handle_call, in_handle_call, 4096);
/* Per-CPU scratch: the event (with its name) is larger than the 512-byte BPF stack. A
 * slot each, taken by scratch_claim (maps.h): these are uprobe programs. */
BPF_PERCPU_ARRAY(handle_scratch, struct kernel_handle_event, SCRATCH_SLOTS);

static __always_inline int handle_call_enter(u32 call, u64 out, u64 source, u64 name)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cuda_admit(id >> 32))
        return 0;
    struct handle_call_key k = {.pid_tgid = id, .call = call};
    struct handle_call v = {.out = out, .source = source, .name = name};
    in_handle_call.update(&k, &v);
    return 0;
}

/* cuModuleGetFunction(CUfunction *out, CUmodule, const char *name) */
int cu_module_get_function(struct pt_regs *ctx)
{
    return handle_call_enter(CALL_CU_MODULE_GET_FUNCTION, PT_REGS_PARM1(ctx), 0, PT_REGS_PARM3(ctx));
}
/* cuLibraryGetKernel(CUkernel *out, CUlibrary, const char *name) */
int cu_library_get_kernel(struct pt_regs *ctx)
{
    return handle_call_enter(CALL_CU_LIBRARY_GET_KERNEL, PT_REGS_PARM1(ctx), 0, PT_REGS_PARM3(ctx));
}
/* cudaLibraryGetKernel(cudaKernel_t *out, cudaLibrary_t, const char *name) */
int cuda_library_get_kernel(struct pt_regs *ctx)
{
    return handle_call_enter(CALL_CUDA_LIBRARY_GET_KERNEL, PT_REGS_PARM1(ctx), 0, PT_REGS_PARM3(ctx));
}
/* cuKernelGetFunction(CUfunction *out, CUkernel kernel) */
int cu_kernel_get_function(struct pt_regs *ctx)
{
    return handle_call_enter(CALL_CU_KERNEL_GET_FUNCTION, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}
/* __cudaGetKernel(cudaKernel_t *out, const void *hostStub): the CUDA 13 <<<>>> path */
int cuda_get_kernel_internal(struct pt_regs *ctx)
{
    return handle_call_enter(CALL_CUDA_GET_KERNEL_INTERNAL, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}
/* cudaGetKernel(cudaKernel_t *out, const void *entryFuncAddr) */
int cuda_get_kernel(struct pt_regs *ctx)
{
    return handle_call_enter(CALL_CUDA_GET_KERNEL, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx), 0);
}

/* Sends one kernel_handle_event: the handle read from `out`, or `handle` itself where
 * `out` is 0 (a call that names a handle it is given: __hipRegisterFunction); the name
 * read from `name`, or the `source` the handle stands for. */
static __always_inline void handle_send(u64 id, u32 call, s32 ret, u64 out, u64 handle, u64 source, u64 name)
{
    int slot = scratch_claim(SCRATCH_HANDLES);
    if (slot < 0)
        return;
    u32 i = slot;
    struct kernel_handle_event *e = handle_scratch.lookup(&i);
    if (!e) {
        scratch_release(SCRATCH_HANDLES, i);
        return;
    }
    fill_header(&e->h, EV_KERNEL_HANDLE, id);
    e->call = call;
    e->ret = ret;
    e->source = source;
    e->handle = handle;
    e->name_len = 0;
    e->pad = 0;
    if (out)
        read_user(&e->handle, sizeof(e->handle), (void *)out, &e->h.flags);
    if (name) {
        long n = bpf_probe_read_user_str(e->name, KERNEL_NAME_CAP, (void *)name);
        if (n > 0)
            e->name_len = n - 1;  /* without the NUL; CAP - 1: may be cut */
        else
            e->h.flags |= EV_FLAG_UNREADABLE;
    }
    u32 size = offsetof(struct kernel_handle_event, name) + (e->name_len & (KERNEL_NAME_CAP - 1));
    submit(e, size);
    scratch_release(SCRATCH_HANDLES, i);
}

static __always_inline int handle_return(struct pt_regs *ctx, u32 call)
{
    u64 id = bpf_get_current_pid_tgid();
    struct handle_call_key k = {.pid_tgid = id, .call = call};
    struct handle_call *c = in_handle_call.lookup(&k);
    if (!c)
        return 0;
    u64 out = c->out, source = c->source, name = c->name;
    in_handle_call.delete(&k);
    handle_send(id, call, (s32)PT_REGS_RC(ctx), out, 0, source, name);
    return 0;
}

/* One return probe per call (the call picks this thread's entry: calls nest). */
int cu_module_get_function_return(struct pt_regs *ctx) { return handle_return(ctx, CALL_CU_MODULE_GET_FUNCTION); }
int cu_library_get_kernel_return(struct pt_regs *ctx) { return handle_return(ctx, CALL_CU_LIBRARY_GET_KERNEL); }
int cuda_library_get_kernel_return(struct pt_regs *ctx) { return handle_return(ctx, CALL_CUDA_LIBRARY_GET_KERNEL); }
int cu_kernel_get_function_return(struct pt_regs *ctx) { return handle_return(ctx, CALL_CU_KERNEL_GET_FUNCTION); }
int cuda_get_kernel_internal_return(struct pt_regs *ctx) { return handle_return(ctx, CALL_CUDA_GET_KERNEL_INTERNAL); }
int cuda_get_kernel_return(struct pt_regs *ctx) { return handle_return(ctx, CALL_CUDA_GET_KERNEL); }
