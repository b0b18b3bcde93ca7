/* ROCm HIP runtime (libamdhip64) uprobes, after cuda_probes.c and kernel_handles.c,
 * whose helpers they use: the same records, the same way out (bpf/call_out.c), their
 * own call ids. HIP copies CUDA's calling conventions, so each handler reads the
 * arguments where its CUDA twin does (cuda_probes.c's ABI note):
 *   hipLaunchKernel(func, dim3 grid, dim3 block, void **args, size_t shmem, stream)
 *     is cudaLaunchKernel: di=func, si/dx=grid, cx/r8=block, [sp+8]=shmem, [sp+16]=stream;
 *   hipModuleLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, stream, params, extra)
 *     is cuLaunchKernel: di..r9 = f..by, [sp+8]=bz, [sp+16]=shmem, [sp+24]=stream;
 *   hipMemcpyKind numbers the directions as cudaMemcpyKind does.
 * libamdhip64 calls none of the probed entries from inside another (its PLT calls go to
 * hipModuleLaunchKernel from hipLaunchByPtr and the GGL path, which are not probed): one
 * launch, one record, with no caller rule (tests/unit/probes/test_hip_library.py). */
#include "maps.h"

/* The runtime launches: cudaLaunchKernel's layout. `shmem32`: the shared memory is an
 * unsigned int (hipLaunchCooperativeKernel), whose stack slot's high half is not defined. */
static __always_inline int hip_runtime_launch(struct pt_regs *ctx, u32 call, int shmem32)
{
    struct launch_event e = {};
    u32 tv = cuda_begin(&e.c, EV_CUDA_LAUNCH, call);
    if (!tv)
        return 0;
    e.func = PT_REGS_PARM1(ctx);
    runtime_dims(ctx, &e.dims);
    u64 a[2];  /* shmem, stream */
    stack_args(ctx, a, 2, &e.c.h.flags);
    e.shmem = shmem32 ? (u32)a[0] : a[0];
    e.stream = a[1];
    EMIT(e, tv, e.func, 0, 0);
    return 0;
}

int hip_launch_kernel(struct pt_regs *ctx) { return hip_runtime_launch(ctx, CALL_HIP_LAUNCH_KERNEL, 0); }
/* hipExtLaunchKernel(func, grid, block, args, shmem, stream, startEvent, stopEvent, flags) */
int hip_ext_launch_kernel(struct pt_regs *ctx) { return hip_runtime_launch(ctx, CALL_HIP_EXT_LAUNCH_KERNEL, 0); }
/* hipLaunchCooperativeKernel(func, grid, block, args, unsigned int shmem, stream) */
int hip_launch_cooperative_kernel(struct pt_regs *ctx)
{
    return hip_runtime_launch(ctx, CALL_HIP_LAUNCH_COOPERATIVE_KERNEL, 1);
}

/* The module launches: cuLaunchKernel's layout (cuda_probes.c driver_layout_launch), with
 * no caller rule. hipExtModuleLaunchKernel passes the global work size in threads. */
int hip_module_launch_kernel(struct pt_regs *ctx)
{
    return driver_layout_launch(ctx, CALL_HIP_MODULE_LAUNCH_KERNEL, 0);
}
int hip_ext_module_launch_kernel(struct pt_regs *ctx)
{
    return driver_layout_launch(ctx, CALL_HIP_EXT_MODULE_LAUNCH_KERNEL, 1);
}

/* hipGraphLaunch(graphExec, stream): counts as a launch; its kernels come from the
 * capture (the CUDA runtime's graph handlers serve HIP's: otel_gpu/cuda_calls.py). */
int hip_graph_launch(struct pt_regs *ctx) { return graph_launch_emit(ctx, CALL_HIP_GRAPH_LAUNCH); }

/* hipMemcpy(dst, src, count, kind), hipMemcpyAsync(dst, src, count, kind, stream) */
int hip_memcpy(struct pt_regs *ctx)
{
    return memcpy_emit(CALL_HIP_MEMCPY, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), 0, 0);
}
int hip_memcpy_async(struct pt_regs *ctx)
{
    return memcpy_emit(CALL_HIP_MEMCPY_ASYNC, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx), 0);
}

/* hipMemcpyHtoD(dst, src, count) and its kin: the direction is in the name (hipMemcpyKind
 * 1 h2d, 2 d2h, 3 d2d); the Async forms add the stream. */
#define MEMCPY_H2D 1
#define MEMCPY_D2H 2
#define MEMCPY_D2D 3
int hip_memcpy_htod(struct pt_regs *ctx) { return memcpy_emit(CALL_HIP_MEMCPY_HTOD, PT_REGS_PARM3(ctx), MEMCPY_H2D, 0, 0); }
int hip_memcpy_dtoh(struct pt_regs *ctx) { return memcpy_emit(CALL_HIP_MEMCPY_DTOH, PT_REGS_PARM3(ctx), MEMCPY_D2H, 0, 0); }
int hip_memcpy_dtod(struct pt_regs *ctx) { return memcpy_emit(CALL_HIP_MEMCPY_DTOD, PT_REGS_PARM3(ctx), MEMCPY_D2D, 0, 0); }
int hip_memcpy_htod_async(struct pt_regs *ctx)
{
    return memcpy_emit(CALL_HIP_MEMCPY_HTOD_ASYNC, PT_REGS_PARM3(ctx), MEMCPY_H2D, PT_REGS_PARM4(ctx), 0);
}
int hip_memcpy_dtoh_async(struct pt_regs *ctx)
{
    return memcpy_emit(CALL_HIP_MEMCPY_DTOH_ASYNC, PT_REGS_PARM3(ctx), MEMCPY_D2H, PT_REGS_PARM4(ctx), 0);
}
int hip_memcpy_dtod_async(struct pt_regs *ctx)
{
    return memcpy_emit(CALL_HIP_MEMCPY_DTOD_ASYNC, PT_REGS_PARM3(ctx), MEMCPY_D2D, PT_REGS_PARM4(ctx), 0);
}

/* hipMemcpy2DAsync(dst, dpitch, src, spitch, width, height, kind, stream); hipFree(ptr);
 * hipSetDevice(int device): as their CUDA twins. */
int hip_memcpy_2d_async(struct pt_regs *ctx) { return memcpy_2d_emit(ctx, CALL_HIP_MEMCPY_2D_ASYNC); }
int hip_free(struct pt_regs *ctx) { return free_emit(ctx, CALL_HIP_FREE); }
int hip_set_device(struct pt_regs *ctx) { return set_device_emit(ctx, CALL_HIP_SET_DEVICE); }

/* hipMalloc(void **ptr, size_t size); the syncs: stream, device, event. cuda_call_return
 * emits them. */
int hip_malloc_enter(struct pt_regs *ctx) { return call_enter(CALL_HIP_MALLOC, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); }
int hip_stream_sync_enter(struct pt_regs *ctx) { return call_enter(CALL_HIP_STREAM_SYNC, PT_REGS_PARM1(ctx), 0); }
int hip_device_sync_enter(struct pt_regs *ctx) { return call_enter(CALL_HIP_DEVICE_SYNC, 0, 0); }
int hip_event_sync_enter(struct pt_regs *ctx) { return call_enter(CALL_HIP_EVENT_SYNC, PT_REGS_PARM1(ctx), 0); }

/* hipModuleGetFunction(hipFunction_t *out, hipModule_t, const char *name) */
int hip_module_get_function(struct pt_regs *ctx)
{
    return handle_call_enter(CALL_HIP_MODULE_GET_FUNCTION, PT_REGS_PARM1(ctx), 0, PT_REGS_PARM3(ctx));
}
int hip_module_get_function_return(struct pt_regs *ctx) { return handle_return(ctx, CALL_HIP_MODULE_GET_FUNCTION); }

/* __hipRegisterFunction(modules, const void *hostFunction, char *deviceFunction,
 * const char *deviceName, ...): hipcc's start-up code registers each kernel's host handle
 * (what its launches pass as func) with its mangled name. The handle is an argument, not
 * an out-parameter: one record at entry. Sent whether or not a request is open (once per
 * kernel and process, before its first launch). */
int hip_register_function(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (cuda_admit(id >> 32))
        handle_send(id, CALL_HIP_REGISTER_FUNCTION, 0, 0, PT_REGS_PARM2(ctx), 0, PT_REGS_PARM4(ctx));
    return 0;
}
