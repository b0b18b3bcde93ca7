/* CUDA stream capture state, read on the launch path (bpf/cuda_probes.c). Kernels
 * launched on a capturing stream are recorded into a graph and do not run: user space
 * must see them (they name what a later cudaGraphLaunch runs) and must not count them as
 * launches. Captures usually happen at warm-up, outside any request, when launches are
 * only counted in the kernel; so while a process has a capture open its launches are
 * streamed, flagged EV_FLAG_CAPTURE, and user space tells the capturing stream's
 * launches (recorded) from other streams' (run). Written by bpf/graph_probes.c. */
#include "maps.h"

/* Captures open in all traced processes together. An array read, which the verifier
 * inlines (no hash lookup): the only cost on the launch path while nothing captures. */
BPF_ARRAY(captures_open, s64, 1);
/* Captures open by tgid: looked up only while captures_open is non-zero. */
BPF_HASH(capture_procs, u32, s64, MAX_PROCS);

static __always_inline int captures_any(void)
{
    u32 zero = 0;
    s64 *all = captures_open.lookup(&zero);
    return all && *all > 0;
}

static __always_inline int capturing(u32 tgid)
{
    if (!captures_any())
        return 0;
    s64 *mine = capture_procs.lookup(&tgid);
    return mine && *mine > 0;
}

/* A launch of a capturing process: always sent (no budget, no rollup, no req_agg),
 * since a recorded launch counted as run would be wrong; a full ring buffer loses it,
 * counted. */
static __always_inline void capture_emit(struct cuda_header *c, u32 size)
{
    c->h.flags |= EV_FLAG_CAPTURE;
    c->ctx = exec_unit(c->h.tgid, c->h.tid);
    if (events.ringbuf_output(c, size, 0) != 0)
        count(CNT_CAPTURE_LOST);
}
