/* NCCL (libnccl.so*) uprobes, entry only for the calls: a collective or send/recv is one
 * nccl_event (bpf/events.h) that leaves through cuda_emit like any CUDA call (streamed
 * while its process has HTTP activity, else counted in `rollup`, detail = communicator).
 * Two pieces of state make the record complete: the calling thread's group
 * (ncclGroupStart/End nesting) and each communicator's size and rank, learnt at the
 * return of its init and forgotten at ncclCommDestroy/ncclCommAbort.
 * Signatures as nccl.h (2.32) declares them; argument registers as cuda_probes.c says. */
#include "maps.h"

/* Communicators by (process, handle). LRU: a process that exits without destroying its
 * communicators must not hold entries forever; eviction needs more live ones than this. */
BPF_TABLE("lru_hash", struct nccl_comm_key, struct nccl_comm, nccl_comms, 16384);

/* The thread's group: nesting depth and the ktime of its outermost ncclGroupStart, which
 * names the group in every call made inside it. */
struct nccl_group {
    u32 depth;
    u32 pad;
    u64 id;
};
BPF_TABLE("lru_hash", u64, struct nccl_group, nccl_groups, 16384);

/* An init in progress, by thread and which init (all: ncclCommInitAll). */
struct nccl_init_key {
    u64 pid_tgid;
    u32 all;
    u32 pad;
};
struct nccl_init {
    u64 out;     /* ncclComm_t *: one handle, or ndev of them (InitAll) */
    u32 nranks;
    s32 rank;    /* -1 for InitAll: handle i is rank i */
};
BPF_TABLE("lru_hash", struct nccl_init_key, struct nccl_init, nccl_inits, 4096);
#define NCCL_INIT_ALL_MAX 16 /* handles of one ncclCommInitAll learnt (devices of a node) */

/* ncclDataType_t -> bytes per element; 0: a type this table does not know (no bytes). */
static __always_inline u64 nccl_type_size(u32 t)
{
    switch (t) {
    case 0: return 1;  /* ncclInt8 */
    case 1: return 1;  /* ncclUint8 */
    case 2: return 4;  /* ncclInt32 */
    case 3: return 4;  /* ncclUint32 */
    case 4: return 8;  /* ncclInt64 */
    case 5: return 8;  /* ncclUint64 */
    case 6: return 2;  /* ncclFloat16 */
    case 7: return 4;  /* ncclFloat32 */
    case 8: return 8;  /* ncclFloat64 */
    case 9: return 2;  /* ncclBfloat16 */
    case 10: return 1; /* ncclFloat8e4m3 */
    case 11: return 1; /* ncclFloat8e5m2 */
    }
    return 0;
}

static __always_inline int nccl_emit(u32 call, u64 count, u32 dtype, u32 redop, s32 peer, u64 comm,
                                     u64 stream, u8 flags)
{
    struct nccl_event e = {};
    u32 tv = cuda_begin(&e.c, EV_NCCL, call);
    if (!tv)
        return 0;
    e.c.h.flags = flags;
    e.count = count;
    e.datatype = dtype;
    e.redop = redop;
    e.peer = peer;
    e.comm = comm;
    e.stream = stream;
    e.rank = -1;
    struct nccl_comm_key k = {.tgid = e.c.h.tgid, .comm = comm};
    struct nccl_comm *cm = nccl_comms.lookup(&k);
    if (cm) {
        e.nranks = cm->nranks;
        e.rank = cm->rank;
    }
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_group *g = nccl_groups.lookup(&id);
    if (g && g->depth)
        e.group = g->id;
    e.bytes = count * nccl_type_size(dtype);
    if (call == CALL_NCCL_ALL_GATHER && e.nranks)
        e.bytes *= e.nranks; /* received: every rank's sendcount */
    EMIT(e, tv, e.comm, e.bytes, 0);
    return 0;
}

/* ncclAllReduce(sendbuff, recvbuff, count, datatype, op, comm, stream) */
int nccl_all_reduce(struct pt_regs *ctx)
{
    u8 flags = 0;
    u64 stream = stack_arg7(ctx, &flags);
    return nccl_emit(CALL_NCCL_ALL_REDUCE, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
                     NCCL_NO_PEER, PT_REGS_PARM6(ctx), stream, flags);
}

/* ncclAllGather(sendbuff, recvbuff, sendcount, datatype, comm, stream) */
int nccl_all_gather(struct pt_regs *ctx)
{
    return nccl_emit(CALL_NCCL_ALL_GATHER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), NCCL_NO_OP, NCCL_NO_PEER,
                     PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), 0);
}

/* ncclReduceScatter(sendbuff, recvbuff, recvcount, datatype, op, comm, stream) */
int nccl_reduce_scatter(struct pt_regs *ctx)
{
    u8 flags = 0;
    u64 stream = stack_arg7(ctx, &flags);
    return nccl_emit(CALL_NCCL_REDUCE_SCATTER, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
                     NCCL_NO_PEER, PT_REGS_PARM6(ctx), stream, flags);
}

/* ncclBroadcast(sendbuff, recvbuff, count, datatype, root, comm, stream) */
int nccl_broadcast(struct pt_regs *ctx)
{
    u8 flags = 0;
    u64 stream = stack_arg7(ctx, &flags);
    return nccl_emit(CALL_NCCL_BROADCAST, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), NCCL_NO_OP,
                     (s32)PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), stream, flags);
}

/* ncclReduce(sendbuff, recvbuff, count, datatype, op, root, comm, stream) */
int nccl_reduce(struct pt_regs *ctx)
{
    u8 flags = 0;
    u64 a[2];  /* comm, stream */
    stack_args(ctx, a, 2, &flags);
    return nccl_emit(CALL_NCCL_REDUCE, PT_REGS_PARM3(ctx), PT_REGS_PARM4(ctx), PT_REGS_PARM5(ctx),
                     (s32)PT_REGS_PARM6(ctx), a[0], a[1], flags);
}

/* ncclSend(sendbuff, count, datatype, peer, comm, stream) */
int nccl_send(struct pt_regs *ctx)
{
    return nccl_emit(CALL_NCCL_SEND, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), NCCL_NO_OP, (s32)PT_REGS_PARM4(ctx),
                     PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), 0);
}

/* ncclRecv(recvbuff, count, datatype, peer, comm, stream) */
int nccl_recv(struct pt_regs *ctx)
{
    return nccl_emit(CALL_NCCL_RECV, PT_REGS_PARM2(ctx), PT_REGS_PARM3(ctx), NCCL_NO_OP, (s32)PT_REGS_PARM4(ctx),
                     PT_REGS_PARM5(ctx), PT_REGS_PARM6(ctx), 0);
}

/* ncclGroupStart(void): the outermost start names the group. */
int nccl_group_start(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cuda_admit(id >> 32))
        return 0;
    struct nccl_group *g = nccl_groups.lookup(&id);
    if (g && g->depth) {
        g->depth++;
        return 0;
    }
    struct nccl_group ng = {.depth = 1, .id = bpf_ktime_get_ns()};
    nccl_groups.update(&id, &ng);
    return 0;
}

/* ncclGroupEnd(void) */
int nccl_group_end(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_group *g = nccl_groups.lookup(&id);
    if (!g)
        return 0;
    if (g->depth > 1)
        g->depth--;
    else
        nccl_groups.delete(&id);
    return 0;
}

static __always_inline int nccl_init_enter(u64 out, u32 nranks, s32 rank, u32 all)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!cuda_admit(id >> 32))
        return 0;
    struct nccl_init_key k = {.pid_tgid = id, .all = all};
    struct nccl_init v = {.out = out, .nranks = nranks, .rank = rank};
    nccl_inits.update(&k, &v);
    return 0;
}

/* ncclCommInitRank(ncclComm_t *comm, int nranks, ncclUniqueId commId, int rank) and
 * ncclCommInitRankConfig(..., int rank, ncclConfig_t *config): the 128-byte commId is
 * passed in memory, so rank is the third integer register. */
int nccl_comm_init_rank(struct pt_regs *ctx)
{
    return nccl_init_enter(PT_REGS_PARM1(ctx), (u32)PT_REGS_PARM2(ctx), (s32)PT_REGS_PARM3(ctx), 0);
}

/* ncclCommInitAll(ncclComm_t *comms, int ndev, const int *devlist): comms[i] is rank i. */
int nccl_comm_init_all(struct pt_regs *ctx)
{
    return nccl_init_enter(PT_REGS_PARM1(ctx), (u32)PT_REGS_PARM2(ctx), -1, 1);
}

static __always_inline void learn_comm(u32 tgid, u64 out, u32 nranks, s32 rank)
{
    struct nccl_comm_key k = {.tgid = tgid};
    u8 flags = 0;
    read_user(&k.comm, sizeof(k.comm), (void *)out, &flags);
    if (flags || !k.comm)
        return;
    struct nccl_comm v = {.nranks = nranks, .rank = rank};
    nccl_comms.update(&k, &v);
}

static __always_inline int nccl_init_return(struct pt_regs *ctx, u32 all)
{
    u64 id = bpf_get_current_pid_tgid();
    struct nccl_init_key k = {.pid_tgid = id, .all = all};
    struct nccl_init *in = nccl_inits.lookup(&k);
    if (!in)
        return 0;
    struct nccl_init v = *in;
    nccl_inits.delete(&k);
    if (PT_REGS_RC(ctx) != 0) /* ncclSuccess only: a failed init hands out nothing */
        return 0;
    if (!all) {
        learn_comm(id >> 32, v.out, v.nranks, v.rank);
        return 0;
    }
    /* Unrolled, no break: the verifier then sees NCCL_INIT_ALL_MAX straight blocks. */
#pragma unroll
    for (int i = 0; i < NCCL_INIT_ALL_MAX; i++) {
        if (i < v.nranks)
            learn_comm(id >> 32, v.out + 8 * i, v.nranks, i);
    }
    return 0;
}

int nccl_comm_init_rank_return(struct pt_regs *ctx) { return nccl_init_return(ctx, 0); }
int nccl_comm_init_all_return(struct pt_regs *ctx) { return nccl_init_return(ctx, 1); }

/* ncclCommDestroy(ncclComm_t comm), ncclCommAbort(ncclComm_t comm) */
int nccl_comm_end(struct pt_regs *ctx)
{
    struct nccl_comm_key k = {.tgid = bpf_get_current_pid_tgid() >> 32, .comm = PT_REGS_PARM1(ctx)};
    nccl_comms.delete(&k);
    return 0;
}
