/* CUDA graph probes: stream capture begin/end, instantiate (graph -> exec), destroy,
 * and the driver's cuGraphLaunch. Each sends one graph_op_event, always (rare calls,
 * usually at warm-up), and capture begin/end keep bpf/graph_capture.c's counts, which
 * make the launch probes stream a capturing process's launches. Out-parameters (the
 * graph at capture end, the exec at instantiate) are read at return. A process's open
 * captures are dropped at its exit. */
#include "maps.h"

/* Entry state by thread and call: the runtime calls the driver inside (nested). */
struct graph_call_key {
    u64 pid_tgid;
    u32 call;
    u32 pad;
};
struct graph_call {
    u64 arg0;  /* stream, or the exec out-pointer */
    u64 arg1;  /* the graph out-pointer, or the graph */
    u64 ts_ns;
};
BPF_TABLE("lru_hash", struct graph_call_key, struct graph_call, in_graph_call, 4096);

/* CUDA_ERROR_STREAM_CAPTURE_INVALIDATED / cudaErrorStreamCaptureInvalidated: the
 * capture ended all the same. */
#define CAPTURE_INVALIDATED 901

static __always_inline void captures_add(u32 tgid, s64 n)
{
    u32 zero = 0;
    s64 *all = captures_open.lookup(&zero);
    s64 none = 0;
    s64 *mine = capture_procs.lookup_or_try_init(&tgid, &none);
    if (!all || !mine)
        return;
    if (n < 0 && *mine <= 0)
        return;  /* an end whose begin we did not see */
    __sync_fetch_and_add(mine, n);
    __sync_fetch_and_add(all, n);
}

static __always_inline int graph_enter(u32 call, u64 arg0, u64 arg1)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cuda_admit(id >> 32))
        return 0;
    struct graph_call_key k = {.pid_tgid = id, .call = call};
    struct graph_call v = {.arg0 = arg0, .arg1 = arg1, .ts_ns = bpf_ktime_get_ns()};
    in_graph_call.update(&k, &v);
    return 0;
}

static __always_inline int graph_return(struct pt_regs *ctx, u32 call)
{
    u64 id = bpf_get_current_pid_tgid();
    struct graph_call_key k = {.pid_tgid = id, .call = call};
    struct graph_call *g = in_graph_call.lookup(&k);
    if (!g)
        return 0;
    struct graph_op_event e = {};
    fill_header(&e.c.h, EV_GRAPH_OP, id);
    e.c.h.ts_ns = g->ts_ns;
    e.c.call = call;
    e.c.ret = (s32)PT_REGS_RC(ctx);
    u64 arg0 = g->arg0, arg1 = g->arg1;
    in_graph_call.delete(&k);
    if (call == CALL_STREAM_BEGIN_CAPTURE || call == CALL_CU_STREAM_BEGIN_CAPTURE) {
        e.stream = arg0;
        if (e.c.ret == 0)
            captures_add(e.c.h.tgid, 1);
    } else if (call == CALL_STREAM_END_CAPTURE || call == CALL_CU_STREAM_END_CAPTURE) {
        e.stream = arg0;
        if (e.c.ret == 0 || e.c.ret == CAPTURE_INVALIDATED)
            captures_add(e.c.h.tgid, -1);
        if (e.c.ret == 0)
            read_user(&e.graph, sizeof(e.graph), (void *)arg1, &e.c.h.flags);
    } else {  /* instantiate: (exec out-pointer, graph) */
        e.graph = arg1;
        if (e.c.ret == 0)
            read_user(&e.graph_exec, sizeof(e.graph_exec), (void *)arg0, &e.c.h.flags);
    }
    e.c.ctx = exec_unit(e.c.h.tgid, e.c.h.tid);
    submit(&e, sizeof(e));
    return 0;
}

/* cudaStreamBeginCapture(stream, mode), cuStreamBeginCapture(_v2)(hStream, mode) */
int cuda_stream_begin_capture(struct pt_regs *ctx) { return graph_enter(CALL_STREAM_BEGIN_CAPTURE, PT_REGS_PARM1(ctx), 0); }
int cuda_stream_begin_capture_return(struct pt_regs *ctx) { return graph_return(ctx, CALL_STREAM_BEGIN_CAPTURE); }
int cu_stream_begin_capture(struct pt_regs *ctx) { return graph_enter(CALL_CU_STREAM_BEGIN_CAPTURE, PT_REGS_PARM1(ctx), 0); }
int cu_stream_begin_capture_return(struct pt_regs *ctx) { return graph_return(ctx, CALL_CU_STREAM_BEGIN_CAPTURE); }
/* cudaStreamEndCapture(stream, cudaGraph_t *pGraph), cuStreamEndCapture(hStream, CUgraph *phGraph) */
int cuda_stream_end_capture(struct pt_regs *ctx) { return graph_enter(CALL_STREAM_END_CAPTURE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); }
int cuda_stream_end_capture_return(struct pt_regs *ctx) { return graph_return(ctx, CALL_STREAM_END_CAPTURE); }
int cu_stream_end_capture(struct pt_regs *ctx) { return graph_enter(CALL_CU_STREAM_END_CAPTURE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); }
int cu_stream_end_capture_return(struct pt_regs *ctx) { return graph_return(ctx, CALL_CU_STREAM_END_CAPTURE); }
/* cudaGraphInstantiate(cudaGraphExec_t *pExec, cudaGraph_t graph, ...) and WithFlags /
 * WithParams; cuGraphInstantiate(WithFlags/_v2/WithParams)(CUgraphExec *phExec, CUgraph, ...) */
int cuda_graph_instantiate(struct pt_regs *ctx) { return graph_enter(CALL_GRAPH_INSTANTIATE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); }
int cuda_graph_instantiate_return(struct pt_regs *ctx) { return graph_return(ctx, CALL_GRAPH_INSTANTIATE); }
int cu_graph_instantiate(struct pt_regs *ctx) { return graph_enter(CALL_CU_GRAPH_INSTANTIATE, PT_REGS_PARM1(ctx), PT_REGS_PARM2(ctx)); }
int cu_graph_instantiate_return(struct pt_regs *ctx) { return graph_return(ctx, CALL_CU_GRAPH_INSTANTIATE); }

/* A process that exits with a capture open (killed or crashed mid-capture) leaves the
 * global switch: else every launch on the host would go on paying the capture_procs
 * lookup. At its main thread's exit, as the collector forgets a process (ProcExit); a
 * raw tracepoint, since http_probes.c holds the TRACEPOINT_PROBE of this event. */
RAW_TRACEPOINT_PROBE(sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, zero = 0;
    if ((u32)id != tgid)
        return 0;
    s64 *mine = capture_procs.lookup(&tgid);
    if (!mine)
        return 0;
    s64 open = *mine;
    capture_procs.delete(&tgid);
    s64 *all = captures_open.lookup(&zero);
    if (all && open > 0)
        __sync_fetch_and_add(all, -open);
    return 0;
}

/* cudaGraphDestroy(graph), cudaGraphExecDestroy(exec) and the driver's: entry only. */
static __always_inline int graph_destroyed(u32 call, u64 graph, u64 graph_exec)
{
    struct graph_op_event e = {};
    if (!cuda_begin(&e.c, EV_GRAPH_OP, call))
        return 0;
    e.graph = graph;
    e.graph_exec = graph_exec;
    submit(&e, sizeof(e));
    return 0;
}
int cuda_graph_destroy(struct pt_regs *ctx) { return graph_destroyed(CALL_GRAPH_DESTROY, PT_REGS_PARM1(ctx), 0); }
int cuda_graph_exec_destroy(struct pt_regs *ctx) { return graph_destroyed(CALL_GRAPH_EXEC_DESTROY, 0, PT_REGS_PARM1(ctx)); }
int cu_graph_destroy(struct pt_regs *ctx) { return graph_destroyed(CALL_CU_GRAPH_DESTROY, PT_REGS_PARM1(ctx), 0); }
int cu_graph_exec_destroy(struct pt_regs *ctx) { return graph_destroyed(CALL_CU_GRAPH_EXEC_DESTROY, 0, PT_REGS_PARM1(ctx)); }

/* cuGraphLaunch(hGraphExec, hStream): a graph launch of its own, unless its caller is the
 * process's CUDA runtime: cudaGraphLaunch passing through, counted once by the rules of the
 * kernel launches (launch_routes.c): dropped when cudaGraphLaunch's probe marked the
 * thread, else counted here as the cudaGraphLaunch (the runtime's exec is the driver's:
 * no pairing). */
int cu_graph_launch(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    int marked = launch_mark_take(id);
    struct graph_event e = {};
    u32 tv = cuda_begin(&e.c, EV_CUDA_GRAPH, CALL_CU_GRAPH_LAUNCH);
    if (!tv)
        return 0;
    if (from_runtime(ctx, e.c.h.tgid)) {
        if (marked) {
            count(CNT_DRIVER_DEDUPED);
            graph_launch_reached(e.c.h.tgid);
            return 0;
        }
        count(CNT_DRIVER_AS_RUNTIME);
        e.c.call = CALL_GRAPH_LAUNCH;
    }
    e.graph_exec = PT_REGS_PARM1(ctx);
    e.stream = PT_REGS_PARM2(ctx);
    EMIT(e, tv, e.graph_exec, 0, 0);
    return 0;
}
