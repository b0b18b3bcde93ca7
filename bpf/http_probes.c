/* HTTP server probes on syscall tracepoints (this kernel has no kprobes, and
 * tracepoints see every language's socket I/O, libc or not). Connections are
 * tracked from accept() so only server sockets are ever copied; reads and writes
 * are copied only for traced processes. User space parses the bytes. */
#include "maps.h"

#define CONN_UNKNOWN 0
#define CONN_HTTP 1
#define CONN_OTHER 2   /* first bytes were not an HTTP/1.x request: ignored */

struct conn_key {
    u32 tgid;
    s32 fd;
};

struct conn_state {
    u32 state;     /* of the plaintext for a TLS connection */
    u32 requests;  /* non-zero once the connection counted in http_active */
    u32 tls;       /* its bytes are TLS records: the syscalls' ciphertext is never sent */
    u32 counted;   /* counted in its process's conn_shares entry */
    u64 ended;     /* 1 once its close, an accept on its number or the prune ended it (claim_conn;
                    * 64 bits: this BPF's compare-and-swap) */
    u64 ssl;       /* the SSL* tied to it (bpf/tls_probes.c); 0: none yet */
    struct req_bounds req; /* its HTTP/1 requests, for those whose records were lost (http_requests.c) */
    u64 draw;      /* the current request's draw (head_sampling.c): names it; 0: none */
    u8 sample;     /* SAMPLE_*: its sampling as the kernel decided it */
    u8 line_start; /* SAMPLE_PENDING: its last read ended a line */
    u8 pad[4];
    u16 parent_at; /* head_scan -> head_parent: the parent's line in the read */
    u64 ino;       /* its socket's inode number: accept_done's (maps.h fd_ino), a seeded one's from /proc; 0: not known */
};

/* Accepted TCP connections of traced processes only, so no neighbour can fill it
 * (connections a process held before it was traced are seeded from /proc by user
 * space). A plain hash, not an LRU: nothing is evicted silently; an accept that
 * finds it full is counted (CNT_CONN_TABLE_FULL) and reported with ACCEPT_UNTRACKED.
 * User space prunes entries whose close was never seen (close_range, dup2). Sized by
 * need (maps.h BY_NEED). */
BPF_F_TABLE("hash", struct conn_key, struct conn_state, conns, MAX_CONNS, BY_NEED);

/* The share of `conns` a traced related server may hold (user space sets `limit`:
 * kernel_io/connection_table.py, related_server_share), and how much it holds. A process with no
 * entry (a CUDA process) is bounded by the table alone: a busy front proxy or a
 * flood on a related listener cannot take the GPU service's room. An accept past the
 * share is counted (CNT_CONN_OVER_SHARE) and reported untracked. */
struct conn_share {
    s64 used;
    s64 limit;
};
BPF_HASH(conn_shares, u32, struct conn_share, MAX_PROCS);

/* A read or write syscall's buffer, as its exit finds it in the saved registers. */
struct io_args {
    s32 fd;
    u32 is_iov;    /* non-zero: buf points at an array of this many struct iovec */
    u64 buf;
};

/* Per-CPU scratch: a sock_io_event is too large for the 512-byte BPF stack. The slack
 * after it lets gather_iov() copy at a variable offset the verifier can bound. The
 * syscall probes' (io_scratch) is theirs alone: they run with preemption disabled. The
 * SSL probes are uprobes: they take a slot of tls_scratch (maps.h scratch_claim). */
struct sock_io_scratch {
    struct sock_io_event e;
    u8 slack[HTTP_DATA_CAP];
};
BPF_PERCPU_ARRAY(io_scratch, struct sock_io_scratch, 1);
BPF_PERCPU_ARRAY(tls_scratch, struct sock_io_scratch, SCRATCH_SLOTS);
#define IOV_GATHER 16 /* iovecs copied, in order, until HTTP_DATA_CAP bytes */
#define H2_WALK_IOVS 1024 /* iovecs the HTTP/2 frame walk reads of one transfer (UIO_MAXIOV) */

/* HTTP/2 framing, followed by the kernel across every transfer of a connection
 * (h2_walk.c), so that no read's frames are lost to the probe's copy size: one
 * direction's position in its byte stream. */
struct h2_side {
    u32 skip;     /* bytes of the current frame's payload (or of the client preface) to come */
    u32 keep;     /* of those, how many go to user space (a header block, SETTINGS, ...) */
    u8 have;      /* bytes of a frame header cut by the last transfer's end, in part[] */
    u8 stop;      /* H2_STOP_*: the walk of this direction gave up; it is walked no more */
    u8 pad[2];
    u8 part[20];  /* those bytes (9 used: a read of up to 9 at up to 8 stays inside) */
};
struct h2_walk {
    struct h2_side side[2]; /* [0]: reads (client to server), [1]: writes */
};
#ifndef MAX_H2_CONNS
#define MAX_H2_CONNS 8192
#endif
/* HTTP/2 connections of traced processes whose frames the kernel walks. Full: a new
 * connection is copied as any other (its first 1 KiB a transfer) and counted
 * (CNT_H2_UNWALKED). */
BPF_HASH(h2_walks, struct conn_key, struct h2_walk, MAX_H2_CONNS);
/* The transfer h2_walk (tail-called: verified once, and able to go on in a new run
 * where one run's steps end) walks next: left by io_done in this CPU's slot. */
struct h2_transfer {
    u64 id;       /* pid_tgid */
    u64 buf;      /* the buffer, or the iovec array */
    u64 ret;      /* bytes transferred */
    s32 fd;
    u32 iovs;     /* iovecs in the array; 0: buf is one buffer */
    u8 kind;      /* EV_SOCK_READ or EV_SOCK_WRITE */
    u8 records;   /* digest records sent so far */
    u8 pad[2];
    u32 at;       /* bytes of the digest record being filled */
    u32 piece;    /* where its open piece's head is; 0: none */
    u32 iov;      /* the iovec being walked */
    u64 pos;      /* offset in the transfer */
    u64 seg;      /* the iovec's (or buffer's) address */
    u64 seg_len;  /* its bytes, and the offset in it */
    u64 seg_off;
};
BPF_PERCPU_ARRAY(h2_transfers, struct h2_transfer, 1);
BPF_PROG_ARRAY(h2_walkers, 1);
/* [0]: 1 once user space installed h2_walk in h2_walkers (kernel_io/program.py); until
 * then (or where the verifier refused it) HTTP/2 connections are copied as any other. */
BPF_ARRAY(h2_walk_on, u32, 1);
#define EMIT_HEAD_SCAN 1 /* emit_sock_io: its read's head is to be decided (head_sampling.c) */
#define EMIT_H2_WALK 2   /* emit_sock_io sent nothing: the transfer is h2_walk's (io_done hands a
                          * walked connection's later transfers to it without copying them first) */

/* The connection is HTTP/2 from here on: its frames are walked, reads from the client
 * preface (`preface`) or a frame boundary. */
static __always_inline void h2_start(struct conn_key *key, int preface)
{
    u32 zero = 0, *on = h2_walk_on.lookup(&zero);
    if (!on || !*on)
        return;
    struct h2_walk w = {};
    if (preface)
        w.side[0].skip = w.side[0].keep = 24;
    if (h2_walks.update(key, &w) != 0)
        count(CNT_H2_UNWALKED);
}

/* A connection is ended once, by whoever comes first: its close, an accept given its
 * number (its close not seen yet: a close is seen at its exit, when another thread's
 * accept may hold the number already), or the prune. 1: this caller ended it, and then
 * gives back what it held (release_conn). */
static __always_inline int claim_conn(struct conn_state *st)
{
    return __sync_val_compare_and_swap(&st->ended, 0, 1) == 0;
}

/* What an ended connection held: its process's http_active and share, its SSL* tie. */
static __always_inline void release_conn(struct conn_key *key, struct conn_state *st)
{
    if (st->req.lost) /* no record of it will tell of them now: whatever it served is over */
        unseen_add(key->tgid, -1);
    if (st->requests) {
        s64 *n = http_active.lookup(&key->tgid);
        if (n)
            __sync_fetch_and_add(n, -1);
        epoch_bump(key->tgid); /* its HTTP activity changed: threads' standing verdicts go */
    }
    h2_walks.delete(key);
    if (st->counted) {
        struct conn_share *share = conn_shares.lookup(&key->tgid);
        if (share)
            __sync_fetch_and_add(&share->used, -1);
    }
    if (st->ssl) {
        struct ssl_key k = {.tgid = key->tgid, .ssl = st->ssl};
        s32 *fd = ssl_fds.lookup(&k);
        if (fd && *fd == key->fd)
            ssl_fds.delete(&k);
    }
}

/* Ends a connection (unless something has) and drops its entry. */
static __always_inline void forget_conn(struct conn_key *key, struct conn_state *st)
{
    if (claim_conn(st))
        release_conn(key, st);
    conns.delete(key);
}

/* accept_done, io_done: called at the syscall's exit (its arguments still in the saved
 * registers), only for a process maybe_traced (http_syscalls.c's dispatch). */
static __always_inline void accept_done(s32 listen_fd, u64 addr, long ret)
{
    u64 id = bpf_get_current_pid_tgid();
    if (ret < 0 || !is_traced(id >> 32)) /* the latter: its pid bit outlived its entry */
        return;
    struct conn_key key = {.tgid = id >> 32, .fd = (s32)ret};
    struct conn_state st = {}, *old = conns.lookup(&key);
    if (old) /* the previous connection on this fd: its close was not seen */
        forget_conn(&key, old);
    struct accept_event e = {};
    struct conn_share *share = conn_shares.lookup(&key.tgid);
    st.counted = share != 0;
    if (share && share->used >= share->limit) {
        count(CNT_CONN_OVER_SHARE);
        e.flags = ACCEPT_UNTRACKED | ACCEPT_OVER_SHARE;
    } else {
        st.ino = e.ino = fd_ino((s32)ret); /* for an entry only: a flood past its share reads no file table */
        if (conns.update(&key, &st) != 0) {
            count(CNT_CONN_TABLE_FULL);
            e.flags = ACCEPT_UNTRACKED;
        } else if (share) {
            __sync_fetch_and_add(&share->used, 1);
        }
    }
    fill_header(&e.h, EV_ACCEPT, id);
    e.fd = (s32)ret;
    e.listen_fd = listen_fd;
    if (addr) {
        bpf_probe_read_user(&e.family, sizeof(e.family), (void *)addr);
        bpf_probe_read_user(&e.peer_port, sizeof(e.peer_port), (void *)(addr + 2));
        if (e.family == 2 /* AF_INET */)
            bpf_probe_read_user(e.peer_addr, 4, (void *)(addr + 4));
        else if (e.family == 10 /* AF_INET6 */)
            bpf_probe_read_user(e.peer_addr, 16, (void *)(addr + 8));
    }
    submit(&e, sizeof(e));
}

/* Returns 1 when the first bytes are an HTTP/1.x request method or the HTTP/2 client
 * preface ("PRI * HTTP/2.0", h2c prior knowledge): user space tells which. */
static __always_inline int looks_like_request(const u8 *b)
{
    u32 w = b[0] | b[1] << 8 | b[2] << 16 | (u32)b[3] << 24;
#define W(a, b_, c, d) ((u32)(a) | (u32)(b_) << 8 | (u32)(c) << 16 | (u32)(d) << 24)
    return w == W('G', 'E', 'T', ' ') || w == W('P', 'O', 'S', 'T') || w == W('P', 'U', 'T', ' ') ||
           w == W('H', 'E', 'A', 'D') || w == W('D', 'E', 'L', 'E') || w == W('P', 'A', 'T', 'C') ||
           w == W('O', 'P', 'T', 'I') || w == W('T', 'R', 'A', 'C') || w == W('C', 'O', 'N', 'N') ||
           w == W('P', 'R', 'I', ' ');
#undef W
}

/* Returns 1 when the bytes start a TLS record (handshake, alert, change cipher spec,
 * application data; versions 3.x), which no HTTP/1.x request does. */
static __always_inline int looks_like_tls(const u8 *b, u32 len)
{
    return len >= 3 && b[0] >= 0x14 && b[0] <= 0x17 && b[1] == 0x03 && b[2] <= 0x04;
}

/* The connection is TLS and its SSL* is `ssl`: from now on the syscall probes send
 * none of its ciphertext, and the SSL probes send its plaintext on this fd. */
static __always_inline void tls_tie(u32 tgid, u64 ssl, s32 fd, struct conn_state *st)
{
    struct ssl_key k = {.tgid = tgid, .ssl = ssl};
    ssl_fds.update(&k, &fd);
    if (!st->tls)
        count(CNT_TLS_CIPHERTEXT);
    st->tls = 1;
    st->ssl = ssl;
}

/* Copies the first bytes of a read/write of a tracked connection into `scratch` and
 * sends them: the one path of the syscall probes (io_scratch) and of the SSL probes
 * (plaintext, `flags` EV_FLAG_TLS, their claimed tls_scratch slot: maps.h scratch_claim),
 * so framing and attribution are the same for both. The first read decides whether the
 * connection is HTTP/1.x; TLS ciphertext is never sent. The caller has set the event's
 * tail (write_tail). Returns EMIT_HEAD_SCAN after a read of a request whose head the kernel
 * has yet to decide (head_sampling.c), EMIT_H2_WALK for a transfer of an HTTP/2
 * connection whose frames the kernel walks (sent by h2_walk, not here). */
static __always_inline int emit_sock_io(struct sock_io_scratch *scratch, u8 kind, u64 id, struct conn_key *key,
                                        struct conn_state *st, u64 buf, u64 copy_max, long ret, u8 flags)
{
    struct sock_io_event *e = &scratch->e;
    u32 len = copy_max < HTTP_DATA_CAP ? (u32)copy_max : HTTP_DATA_CAP;
    if (len > HTTP_DATA_CAP || len == 0) /* keeps the verifier's bounds explicit */
        return 0;
    /* buf 0: gather_iov() already put `copy_max` bytes in e->data. */
    if (buf && bpf_probe_read_user(e->data, len, (void *)buf) != 0)
        return 0;
    if (kind == EV_SOCK_READ && !flags && st->state == CONN_UNKNOWN && looks_like_tls(e->data, len)) {
        /* TLS whose SSL* is not known yet (a memory BIO: the SSL call comes after this
         * read, on this thread), or a stack without SSL probes: nothing is sent. */
        if (!st->tls)
            count(CNT_TLS_CIPHERTEXT);
        st->tls = 1;
        s32 fd = key->fd;
        tls_last_read.update(&id, &fd);
        return 0;
    }
    if (kind == EV_SOCK_READ && st->state == CONN_UNKNOWN) {
        /* The first read decides: HTTP/1.x, or ignored from now on (user space
         * still gets this one read, to count the drop). */
        if (len >= 4 && !looks_like_request(e->data)) {
            st->state = CONN_OTHER;
        } else {
            st->state = CONN_HTTP;
            st->requests = 1;
            st->req.unframed = len >= 4 && e->data[0] == 'P' && e->data[1] == 'R' && e->data[2] == 'I' &&
                           e->data[3] == ' ';
            if (st->req.unframed && !flags) /* the syscalls' bytes: h2_walk follows them */
                h2_start(key, 1);
            u32 tgid = key->tgid;
            pid_mark(tgid, PID_SLOW); /* before the count: the launch probe's fast path reads it */
            s64 one = 1, *n = http_active.lookup(&tgid);
            if (n)
                __sync_fetch_and_add(n, 1);
            else
                http_active.update(&tgid, &one);
        }
    } else if (kind == EV_SOCK_WRITE && st->state != CONN_HTTP) {
        return 0;
    }
    if (st->req.unframed && !flags && h2_walks.lookup(key)) /* the read that started the walk */
        return EMIT_H2_WALK;
    fill_header(&e->h, kind, id);
    e->h.flags = flags | request_boundary(key->tgid, &st->req, kind, e->h.ts_ns);
    if (thread_times_now((u32)id, e->h.ts_ns, e->times))
        e->h.flags |= EV_FLAG_TIMES;
    e->draw = 0;
    if (e->h.flags & EV_FLAG_REQ_START) {
        st->draw = e->draw = head_draw();
        /* head_scan decides, after the syscall probes' reads only (the SSL probes' are uprobes) */
        st->sample = st->draw && !(flags & EV_FLAG_TLS) ? SAMPLE_PENDING : SAMPLE_NONE;
        st->line_start = 0;
    }
    e->lost = st->req.lost;
    e->fd = key->fd;
    e->ret = ret;
    e->data_len = len;
    e->ctx = exec_unit(key->tgid, (u32)id);
    u32 size = offsetof(struct sock_io_event, data) + len;
    if (size > sizeof(*e))
        return 0;
    /* A response "HTTP/1.x 101": what follows on the connection is another protocol. */
    int switching = kind == EV_SOCK_WRITE && len >= 12 && e->data[0] == 'H' && e->data[1] == 'T' &&
                    e->data[5] == '1' && e->data[9] == '1' && e->data[10] == '0' && e->data[11] == '1';
    record_sent(key->tgid, &st->req, epoch_submit(e, size, &e->h, kind == EV_SOCK_READ), e->h.flags, e->lost);
    if (switching) {
        st->req.unframed = 1; /* after record_sent: a lost 101 is its request's loss */
        st->sample = SAMPLE_NONE; /* its streams are the collector's to sample, each its own */
        if (!flags) /* h2c (or a WebSocket, which user space then leaves): the client's preface is next */
            h2_start(key, 1);
    }
    return kind == EV_SOCK_READ && st->sample == SAMPLE_PENDING ? EMIT_HEAD_SCAN : 0;
}

/* A write's last HTTP_TAIL_CAP bytes into the scratch event (user space finds a chunked
 * body's end in them), when `buf` is the whole buffer; none for an iovec (buf 0) or a
 * read. Read before emit_sock_io, in a program without the iovec path (io_done): as a
 * branch after the iovec copy's unrolled loop it made the verifier walk the rest of each
 * write program once more per state (127 k instructions, 0.22 s each of a warm start). */
static __always_inline void write_tail(struct sock_io_scratch *scratch, u8 kind, u64 buf, long ret)
{
    scratch->e.tail_len = 0;
    if (kind != EV_SOCK_WRITE || !buf || ret < HTTP_TAIL_CAP)
        return;
    bpf_probe_read_user(scratch->e.tail, HTTP_TAIL_CAP, (void *)(buf + ret - HTTP_TAIL_CAP));
    scratch->e.tail_len = HTTP_TAIL_CAP;
}

/* Copies the first bytes of a readv/writev/recvmsg/sendmsg into the scratch event's data,
 * iovec after iovec (gRPC's C-core writes each frame header and payload from its own
 * iovec: the first alone is often 9 bytes). Returns the bytes copied: always a prefix of
 * what the syscall transferred. */
static __always_inline u32 gather_iov(u64 iovp, u32 count, u64 ret)
{
    u32 zero = 0;
    struct sock_io_scratch *scratch = io_scratch.lookup(&zero);
    if (!scratch)
        return 0;
    u32 off = 0;
    u64 left = ret;
#pragma unroll
    for (int i = 0; i < IOV_GATHER; i++) {
        if (i >= count || left == 0 || off >= HTTP_DATA_CAP)
            break;
        u64 iov[2] = {};
        if (bpf_probe_read_user(iov, sizeof(iov), (void *)(iovp + i * sizeof(iov))) != 0)
            break;
        u64 n = iov[1] < left ? iov[1] : left;
        left -= n;
        if (n > HTTP_DATA_CAP - off)
            n = HTTP_DATA_CAP - off;
        /* Barriers: clang would drop the mask and the check, which the verifier needs. */
        asm volatile("" : "+r"(off), "+r"(n));
        off &= HTTP_DATA_CAP - 1; /* < HTTP_DATA_CAP, and n <= HTTP_DATA_CAP: within the slack */
        if (n == 0 || n > HTTP_DATA_CAP)
            continue;
        if (bpf_probe_read_user(scratch->e.data + off, n, (void *)iov[0]) != 0)
            break;
        off += n;
    }
    return off;
}

/* Hands the transfer to h2_walk (tail-called: it returns only where h2_walk is not
 * installed, counted). */
static __always_inline void h2_walk_transfer(void *ctx, u8 kind, u64 id, struct io_args *p, long ret, int iovec)
{
    u32 zero = 0;
    struct h2_transfer *t = h2_transfers.lookup(&zero);
    if (!t)
        return;
    struct h2_transfer z = {.id = id, .buf = p->buf, .ret = (u64)ret, .fd = p->fd, .iovs = iovec ? p->is_iov : 0,
                            .kind = kind, .seg = p->buf, .seg_len = iovec ? 0 : (u64)ret};
    *t = z;
    h2_walkers.call(ctx, 0);
    count(CNT_H2_UNWALKED);
}

/* `iovec`: the syscall's buffer is an iovec array (readv, writev, recvmsg, sendmsg); a
 * constant, so each program holds one path only (each path is verified once, not for
 * every state of the other). */
static __always_inline void io_done(void *ctx, u8 kind, struct io_args p, long ret, int iovec)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_traced(tgid))
        return;
    struct conn_key key = {.tgid = tgid, .fd = p.fd};
    struct conn_state *st = conns.lookup(&key);
    if (!st || st->ended || (st->state == CONN_OTHER && !st->tls))
        return;
    if (st->tls) { /* ciphertext: its plaintext comes from the SSL probes */
        if (!st->ssl && kind == EV_SOCK_READ)
            tls_last_read.update(&id, &key.fd);
        return;
    }
    struct tls_call *t = tls_calls.lookup(&id);
    if (t) { /* inside SSL_read/SSL_write/SSL_do_handshake: this is its SSL*'s socket */
        tls_tie(tgid, t->ssl, key.fd, st);
        return;
    }
    if (ret <= 0)
        return;
    u64 buf = p.buf, copy_max = (u64)ret;
    if (st->req.unframed && h2_walks.lookup(&key)) { /* walked: h2_walk alone reads its bytes */
        h2_walk_transfer(ctx, kind, id, &p, ret, iovec);
        return;
    }
    if (iovec) { /* struct iovec { void *base; size_t len; } x is_iov */
        copy_max = gather_iov(buf, p.is_iov, (u64)ret);
        buf = 0;
        if (!copy_max)
            return;
    }
    u32 zero = 0;
    struct sock_io_scratch *scratch = io_scratch.lookup(&zero);
    if (!scratch)
        return;
    write_tail(scratch, kind, buf, ret);
    int next = emit_sock_io(scratch, kind, id, &key, st, buf, copy_max, ret, 0);
    if (next == EMIT_HEAD_SCAN) {
        head_scans.call(ctx, HEAD_SCAN); /* returns only where no head_scan is installed */
    } else if (next == EMIT_H2_WALK) { /* its first read, the preface: HTTP/2 from here on */
        h2_walk_transfer(ctx, kind, id, &p, ret, iovec);
    }
}
