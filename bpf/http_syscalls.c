/* The syscalls the HTTP server probes follow (after http_probes.c, whose handlers each
 * program calls with its arguments): accept, the reads and writes of every flavour,
 * close (a tracked connection ends), and process exit.
 *
 * Attached once, at raw_syscalls' sys_exit alone: a raw tracepoint builds no perf record
 * per hit, as the per-syscall tracepoints do, and that record was most of what every
 * process on the host paid for them (bench item 7); and each call is seen once, at its
 * exit, where its arguments are still in the registers saved at its entry (the kernel
 * writes only ax, the return value) and its result is known. So nothing is kept between
 * a call's entry and exit, and no program runs at any syscall's entry on the host.
 * An untraced process's syscall costs the dispatch and one inlined pid read. A traced
 * process's is tail-called, by its number (orig_ax), into the program for that syscall
 * (on_<name>), which probes/syscalls.py puts in sys_exits as the program loads, before any
 * process is traced. x86-64: its numbers, and the arguments in di, si and dx (a traced
 * process is a 64-bit CUDA or HIP one: no ia32 calls). */
#include "maps.h"

#define SYSCALL_SLOTS 512 /* above x86-64's highest syscall number (463 in 6.18) */
BPF_PROG_ARRAY(sys_exits, SYSCALL_SLOTS);

RAW_TRACEPOINT_PROBE(sys_exit) /* args[0]: the saved registers, args[1]: the return value */
{
    if (!maybe_traced(bpf_get_current_pid_tgid() >> 32))
        return 0;
    u64 nr = SYSCALL_SLOTS;
    bpf_probe_read_kernel(&nr, sizeof(nr), &((struct pt_regs *)ctx->args[0])->orig_ax);
    sys_exits.call(ctx, (u32)nr); /* returns where no program is for it */
    return 0;
}

/* Argument `i` (0, 1 or 2: a constant) of the syscall, from the registers saved at its entry. */
static __always_inline u64 sys_arg(struct bpf_raw_tracepoint_args *ctx, int i)
{
    struct pt_regs *regs = (struct pt_regs *)ctx->args[0];
    u64 v = 0;
    bpf_probe_read_kernel(&v, sizeof(v), i == 0 ? &regs->di : i == 1 ? &regs->si : &regs->dx);
    return v;
}
#define SYS_RET(ctx) ((long)(ctx)->args[1])
#define ON(name) int on_##name(struct bpf_raw_tracepoint_args *ctx)

ON(accept4) { accept_done(sys_arg(ctx, 0), sys_arg(ctx, 1), SYS_RET(ctx)); return 0; }
ON(accept) { accept_done(sys_arg(ctx, 0), sys_arg(ctx, 1), SYS_RET(ctx)); return 0; }

/* A buffer syscall's arguments: fd, then a buffer (iovecs = 0) or an array of `iovecs`. */
static __always_inline struct io_args io_args_of(struct bpf_raw_tracepoint_args *ctx, u64 buf, u32 iovecs)
{
    struct io_args a = {.fd = sys_arg(ctx, 0), .is_iov = iovecs, .buf = buf};
    return a;
}
/* An iovec count as io_args.is_iov: never 0 (that means a plain buffer). */
static __always_inline u32 iov_count(u64 n)
{
    return n == 0 ? 1 : n > H2_WALK_IOVS ? H2_WALK_IOVS : (u32)n;
}
#define PLAIN(ctx) io_args_of(ctx, sys_arg(ctx, 1), 0)
#define IOVEC(ctx) io_args_of(ctx, sys_arg(ctx, 1), iov_count(sys_arg(ctx, 2)))

ON(read) { io_done(ctx, EV_SOCK_READ, PLAIN(ctx), SYS_RET(ctx), 0); return 0; }
ON(recvfrom) { io_done(ctx, EV_SOCK_READ, PLAIN(ctx), SYS_RET(ctx), 0); return 0; }
ON(readv) { io_done(ctx, EV_SOCK_READ, IOVEC(ctx), SYS_RET(ctx), 1); return 0; }
ON(write) { io_done(ctx, EV_SOCK_WRITE, PLAIN(ctx), SYS_RET(ctx), 0); return 0; }
ON(sendto) { io_done(ctx, EV_SOCK_WRITE, PLAIN(ctx), SYS_RET(ctx), 0); return 0; }
ON(writev) { io_done(ctx, EV_SOCK_WRITE, IOVEC(ctx), SYS_RET(ctx), 1); return 0; }

/* recvmsg/sendmsg: struct user_msghdr { name; namelen(+pad); msg_iov @16; msg_iovlen @24; ... } */
static __always_inline struct io_args msg_args(struct bpf_raw_tracepoint_args *ctx)
{
    u64 msg = sys_arg(ctx, 1), iov = 0, n = 0;
    bpf_probe_read_user(&iov, sizeof(iov), (void *)(msg + 16));
    bpf_probe_read_user(&n, sizeof(n), (void *)(msg + 24));
    return io_args_of(ctx, iov, iov_count(n));
}
ON(recvmsg) { io_done(ctx, EV_SOCK_READ, msg_args(ctx), SYS_RET(ctx), 1); return 0; }
ON(sendmsg) { io_done(ctx, EV_SOCK_WRITE, msg_args(ctx), SYS_RET(ctx), 1); return 0; }

/* A tracked connection's close, seen at its exit: its fd is released by then (whatever
 * close returned), so another thread's accept may hold the same number already, and its
 * exit may run before this one, after it, or beside it on another CPU. So:
 *  - an entry whose socket the number still holds is that accept's (or the close failed): left;
 *  - the connection is ended once (claim_conn): by this close or by that accept, whichever
 *    comes first; the close record carries its socket's inode, so that user space, which
 *    may read the accept first, tells it from the new connection's;
 *  - the entry is deleted here only while the number is free: once an accept holds it, its
 *    exit replaces the entry (deleting here could take the new connection's), and a file
 *    opened on it leaves an ended entry for the prune. */
ON(close)
{
    u64 id = bpf_get_current_pid_tgid();
    struct conn_key key = {.tgid = id >> 32, .fd = sys_arg(ctx, 0)};
    struct conn_state *st = conns.lookup(&key);
    if (!st)
        return 0;
    u64 held = fd_ino(key.fd); /* what the number holds now: 0 free */
    if ((st->ino && held == st->ino) || !claim_conn(st))
        return 0;
    /* Every tracked connection's close is reported: user space holds state from its accept. */
    int report = is_traced(key.tgid);
    struct close_event e = {};
    fill_header(&e.h, EV_SOCK_CLOSE, id);
    e.fd = key.fd;
    e.lost = st->req.lost;
    e.ino = st->ino;
    request_closed(key.tgid, &st->req, report ? epoch_submit(&e, sizeof(e), &e.h, 0) : -1, e.lost, e.h.ts_ns);
    release_conn(&key, st);
    if (!held && !fd_ino(key.fd)) /* still free: no accept's entry can be here yet */
        conns.delete(&key);
    return 0;
}

/* A head's sampling, decided (head_sampling.c): for the connection, and for the unit
 * that read its end. */
static __always_inline void head_decided(struct sock_io_event *e, struct conn_key *key, struct conn_state *st,
                                         u8 sample)
{
    st->sample = sample;
    count(sample == SAMPLE_NONE ? CNT_HEAD_LEFT : CNT_HEAD_DECIDED);
    struct unit_key k = unit_key_of(key->tgid, (u64)key->tgid << 32 | e->h.tid, e->ctx);
    struct unit_head *last = unit_heads.lookup(&k);
    struct unit_head now = {.draw = st->draw, .fd = key->fd};
    if (last && last->fd != key->fd) { /* its last head on another connection: answered yet? */
        struct conn_key other = {.tgid = key->tgid, .fd = last->fd};
        struct conn_state *o = conns.lookup(&other);
        now.several = last->several || (o && o->draw == last->draw && o->req.phase == PHASE_READ);
    } else if (last) {
        now.several = last->several;
    }
    unit_heads.update(&k, &now);
}

/* The request (its scratch record, connection and settings) whose head the programs
 * below decide, or NULL. */
static __always_inline struct sock_io_event *head_pending(struct conn_key *key, struct conn_state **stp,
                                                          struct head_settings **setp)
{
    u32 zero = 0;
    struct sock_io_scratch *scratch = io_scratch.lookup(&zero);
    *setp = head_settings.lookup(&zero);
    if (!scratch || !*setp)
        return 0;
    key->tgid = scratch->e.h.tgid;
    key->fd = scratch->e.fd;
    *stp = conns.lookup(key);
    return *stp && (*stp)->sample == SAMPLE_PENDING ? &scratch->e : 0;
}

/* Never attached: the read probes tail-call it (head_scans) after a read of a request
 * whose head is not decided yet went out, its record still in this CPU's io_scratch. */
int head_scan(void *ctx)
{
    struct conn_key key = {};
    struct conn_state *st;
    struct head_settings *set;
    struct sock_io_event *e = head_pending(&key, &st, &set);
    if (!e)
        return 0;
    u32 len = e->data_len, says = HEAD_UNSEEN;
    int first = e->h.flags & EV_FLAG_REQ_START;
    if (len && e->ret == len && !st->req.unframed && (!first || len < 4 || looks_like_request(e->data))) {
        asm volatile("" : "+r"(len)); /* clang would fold the bound into the check above */
        if (len <= HTTP_DATA_CAP) {
            __builtin_memset(e->data + len, 0, 16); /* the scans read up to 8 bytes past a line's end */
            u64 w;
            __builtin_memcpy(&w, e->data, sizeof(w));
            if (!(st->line_start && parent_line(w))) /* a parent cut at the read: left to user space */
                says = head_scan_read(e->data, len, st->line_start);
            st->line_start = e->data[(len - 1) & (HTTP_DATA_CAP - 1)] == '\n';
        }
    }
    if (says == HEAD_MORE)
        return 0; /* its next read goes on (a head read a byte at a time: Go's background read) */
    if ((says & HEAD_KIND) == HEAD_PARENT && !(says & HEAD_ENDED_BEFORE)) {
        st->parent_at = says >> HEAD_AT_SHIFT;
        head_scans.call(ctx, HEAD_PARENT_PARSE); /* returns only where head_parent is not installed */
    }
    head_decided(e, &key, st, says == HEAD_ENDED ? (st->draw < set->bound ? SAMPLE_IN : SAMPLE_OUT) : SAMPLE_NONE);
    return 0;
}

/* Never attached: head_scan tail-calls it for a head with a "tracepar" line (at
 * conn_state.parent_at in the read), which decides when it is a canonical traceparent
 * and the head ends in this read with no other. */
int head_parent(void *ctx)
{
    struct conn_key key = {};
    struct conn_state *st;
    struct head_settings *set;
    struct sock_io_event *e = head_pending(&key, &st, &set);
    if (!e)
        return 0;
    u32 len = e->data_len, at = st->parent_at;
    asm volatile("" : "+r"(len), "+r"(at)); /* bounds the verifier can see: */
    if (len > HTTP_DATA_CAP)
        return 0;
    at &= HTTP_DATA_CAP - 1; /* an offset in the read, which head_scan found */
    head_decided(e, &key, st, parent_sample(e->data, len, at, set->parents, set->bound));
    return 0;
}

/* Never attached: user space runs it (BPF_PROG_TEST_RUN, kernel_io/run_program.py) for a
 * connection whose close the kernel never saw (close_range, dup2), found by its prune.
 * It forgets the connection as a seen close does (http_active, the share, the SSL tie):
 * these counters are atomic here, where user space could only read and write them back
 * over a concurrent probe's change. args[0]: tgid, args[1]: fd, args[2]: the socket's inode
 * number as user space listed the entry: an accept since then on that fd (another inode)
 * is left alone. Returns 1 if it was there. */
int forget_unseen_close(struct bpf_raw_tracepoint_args *ctx)
{
    struct conn_key key = {.tgid = ctx->args[0], .fd = ctx->args[1]};
    struct conn_state *st = conns.lookup(&key);
    if (!st || st->ino != ctx->args[2])
        return 0;
    forget_conn(&key, st);
    return 1;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32, tid = id;
    thread_times.delete(&tid); /* each task that exits (bpf/thread_times.c) */
    if (tid != tgid)
        return 0; /* a thread */
    pid_unmark(tgid); /* the pid may be reused */
    if (!is_traced(tgid))
        return 0;
    /* User space drops this process's connections and rollups when it sees this. */
    struct proc_exit_event e = {};
    fill_header(&e.h, EV_PROC_EXIT, id);
    bpf_get_current_comm(e.comm, sizeof(e.comm));
    submit(&e, sizeof(e));
    return 0;
}
