/* The syscalls the HTTP server probes follow (after http_probes.c, whose handlers each
 * tracepoint calls with its arguments): accept, the reads and writes of every flavour,
 * close (a tracked connection ends), and process exit. */
#include "maps.h"

TRACEPOINT_PROBE(syscalls, sys_enter_accept4) { accept_enter(args->fd, args->upeer_sockaddr); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_accept4) { accept_exit(args->ret); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_accept) { accept_enter(args->fd, args->upeer_sockaddr); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_accept) { accept_exit(args->ret); return 0; }

TRACEPOINT_PROBE(syscalls, sys_enter_read) { io_enter(EV_SOCK_READ, args->fd, (u64)args->buf, 0); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_read) { io_exit(EV_SOCK_READ, args->ret, 0); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_recvfrom) { io_enter(EV_SOCK_READ, args->fd, (u64)args->ubuf, 0); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_recvfrom) { io_exit(EV_SOCK_READ, args->ret, 0); return 0; }
/* An iovec count as pending_io.is_iov: never 0 (that means a plain buffer). */
static __always_inline u32 iov_count(u64 n)
{
    return n == 0 ? 1 : n > IOV_GATHER ? IOV_GATHER : (u32)n;
}
TRACEPOINT_PROBE(syscalls, sys_enter_readv) { io_enter(EV_SOCK_READ, args->fd, (u64)args->vec, iov_count(args->vlen)); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_readv) { io_exit(EV_SOCK_READ, args->ret, 1); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_write) { io_enter(EV_SOCK_WRITE, args->fd, (u64)args->buf, 0); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_write) { io_exit(EV_SOCK_WRITE, args->ret, 0); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_sendto) { io_enter(EV_SOCK_WRITE, args->fd, (u64)args->buff, 0); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendto) { io_exit(EV_SOCK_WRITE, args->ret, 0); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_writev) { io_enter(EV_SOCK_WRITE, args->fd, (u64)args->vec, iov_count(args->vlen)); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_writev) { io_exit(EV_SOCK_WRITE, args->ret, 1); return 0; }

/* recvmsg/sendmsg: struct user_msghdr { name; namelen(+pad); msg_iov @16; msg_iovlen @24; ... } */
static __always_inline u64 msg_iov(u64 msg)
{
    u64 iov = 0;
    bpf_probe_read_user(&iov, sizeof(iov), (void *)(msg + 16));
    return iov;
}
static __always_inline u32 msg_iovlen(u64 msg)
{
    u64 n = 0;
    bpf_probe_read_user(&n, sizeof(n), (void *)(msg + 24));
    return iov_count(n);
}
TRACEPOINT_PROBE(syscalls, sys_enter_recvmsg) { io_enter(EV_SOCK_READ, args->fd, msg_iov((u64)args->msg), msg_iovlen((u64)args->msg)); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_recvmsg) { io_exit(EV_SOCK_READ, args->ret, 1); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_sendmsg) { io_enter(EV_SOCK_WRITE, args->fd, msg_iov((u64)args->msg), msg_iovlen((u64)args->msg)); return 0; }
TRACEPOINT_PROBE(syscalls, sys_exit_sendmsg) { io_exit(EV_SOCK_WRITE, args->ret, 1); return 0; }

TRACEPOINT_PROBE(syscalls, sys_enter_close)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!maybe_traced(id >> 32))
        return 0; /* untraced: its connections went with forget() */
    struct conn_key key = {.tgid = id >> 32, .fd = args->fd};
    struct conn_state *st = conns.lookup(&key);
    if (!st)
        return 0;
    /* Every tracked connection's close is reported: user space holds state from its accept. */
    int report = is_traced(key.tgid);
    struct close_event e = {};
    fill_header(&e.h, EV_SOCK_CLOSE, id);
    e.fd = key.fd;
    e.lost = st->req.lost;
    request_closed(key.tgid, &st->req, report ? epoch_submit(&e, sizeof(e), &e.h, 0) : -1, e.lost, e.h.ts_ns);
    forget_conn(&key, st);
    return 0;
}

/* Never attached: user space runs it (BPF_PROG_TEST_RUN, kernel_io/run_program.py) for a
 * connection whose close the kernel never saw (close_range, dup2), found by its prune.
 * It forgets the connection as a seen close does (http_active, the share, the SSL tie):
 * these counters are atomic here, where user space could only read and write them back
 * over a concurrent probe's change. args[0]: tgid, args[1]: fd. Returns 1 if it was there. */
int forget_unseen_close(struct bpf_raw_tracepoint_args *ctx)
{
    struct conn_key key = {.tgid = ctx->args[0], .fd = ctx->args[1]};
    struct conn_state *st = conns.lookup(&key);
    if (!st)
        return 0;
    forget_conn(&key, st);
    return 1;
}

TRACEPOINT_PROBE(sched, sched_process_exit)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if ((u32)id != tgid)
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
