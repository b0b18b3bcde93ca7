/* HTTP/2 frames walked in the kernel. A multiplexed connection's one read can carry the
 * HEADERS of a hundred streams, far past the 1 KiB the socket probes copy; a copy that
 * stops inside the frames loses the framing (where the next frame starts) and with it
 * every stream of the connection. So for an HTTP/2 connection (http_probes.c h2_start)
 * each transfer is walked frame header by frame header, across reads and iovecs, and
 * user space gets a digest (events.h EV_FLAG_H2_DIGEST): every frame header, and the
 * payloads it parses (header blocks, SETTINGS, RST_STREAM, GOAWAY's first 8 bytes),
 * never DATA. A frame header cut by a transfer's end is kept (h2_side.part) and joined
 * at the next. What the walk cannot cover stops it for good, with its cause on the
 * record (H2_STOP_*), which user space counts as it drops the connection.
 *
 * Tail-called by io_done (http_probes.c) with the transfer in this CPU's h2_transfers
 * slot; a run walks H2_WALK_STEPS steps and tail-calls itself to go on, so a transfer
 * gets up to ~32 runs (the kernel's tail-call limit) while the verifier checks one.
 * Comes after http_syscalls.c (conns, the emit path's helpers). */
#include "maps.h"

#ifndef H2_WALK_STEPS
#define H2_WALK_STEPS 48
#endif
#define H2_HEADER 9

struct h2_scratch {
    struct sock_io_event e;                  /* its data[] goes on into more[] */
    u8 more[H2_DIGEST_CAP - HTTP_DATA_CAP];
    u8 slack[H2_DIGEST_CAP];                 /* a copy at a bounded offset stays inside */
};
BPF_PERCPU_ARRAY(h2_scratch, struct h2_scratch, 1);

/* Payload bytes of a frame that user space parses: header blocks (HEADERS, PUSH_PROMISE,
 * CONTINUATION), SETTINGS, RST_STREAM, GOAWAY's last stream and code. */
static __always_inline u32 h2_kept(u8 type, u32 len)
{
    if (type == 1 || type == 5 || type == 9 || type == 4 || type == 3)
        return len;
    if (type == 7)
        return len < 8 ? len : 8;
    return 0; /* DATA, PRIORITY, PING, WINDOW_UPDATE, unknown types */
}

/* Sends the digest record filled so far; `more`: others of the transfer follow. */
static __always_inline void h2_send(struct h2_scratch *s, struct h2_transfer *t, struct conn_state *st, u8 stop,
                                    int more)
{
    struct sock_io_event *e = &s->e;
    u32 tgid = t->id >> 32;
    fill_header(&e->h, t->kind, t->id);
    e->h.flags = EV_FLAG_H2_DIGEST;
    if (thread_times_now((u32)t->id, e->h.ts_ns, e->times))
        e->h.flags |= EV_FLAG_TIMES;
    e->draw = 0;
    e->lost = st->req.lost;
    e->fd = t->fd;
    e->ret = t->ret;
    e->tail_len = 0;
    e->ctx = exec_unit(tgid, (u32)t->id);
    e->data[0] = stop;
    e->data[1] = more;
    u32 len = t->at;
    if (len > H2_DIGEST_CAP)
        return;
    e->data_len = len;
    /* The transfer's first record counts as its read (maps.h http_seq.reads). */
    int read = t->kind == EV_SOCK_READ && t->records == 0;
    record_sent(tgid, &st->req, epoch_submit(e, offsetof(struct sock_io_event, data) + len, &e->h, read), 0,
                e->lost);
    t->records++;
    t->at = H2_DIGEST_HEAD;
    t->piece = 0;
}

/* Appends `n` bytes of the transfer at t->pos (from `src`) to the digest: to the open
 * piece when they follow it, else as a new piece. Returns the bytes taken (fewer where the
 * record is full: the caller sends it and goes on), or -1 when unreadable. */
static __always_inline long h2_copy(struct h2_scratch *s, struct h2_transfer *t, u64 src, u32 n)
{
    u32 at = t->at, head = t->piece ? 0 : H2_PIECE_HEAD;
    if (at + head >= H2_DIGEST_CAP)
        return 0;
    u32 room = H2_DIGEST_CAP - at - head;
    if (n > room)
        n = room;
    u8 *d = s->e.data;
    if (head) {
        u32 h = at & (H2_DIGEST_CAP - 1);
        u32 off = (u32)t->pos;
        d[h] = off;
        d[(h + 1) & (2 * H2_DIGEST_CAP - 1)] = off >> 8;
        d[(h + 2) & (2 * H2_DIGEST_CAP - 1)] = off >> 16;
        d[(h + 3) & (2 * H2_DIGEST_CAP - 1)] = off >> 24;
        d[(h + 4) & (2 * H2_DIGEST_CAP - 1)] = 0;
        d[(h + 5) & (2 * H2_DIGEST_CAP - 1)] = 0;
        t->piece = at;
        at += H2_PIECE_HEAD;
    }
    u32 to = at, cnt = n;
    asm volatile("" : "+r"(to), "+r"(cnt)); /* the masks below are what the verifier sees */
    to &= H2_DIGEST_CAP - 1;
    cnt &= H2_DIGEST_CAP - 1;
    if (cnt == 0 || bpf_probe_read_user(d + to, cnt, (void *)src) != 0)
        return cnt == 0 ? 0 : -1;
    t->at = at + cnt;
    u32 p = t->piece & (H2_DIGEST_CAP - 1);
    u16 plen = (d[(p + 4) & (2 * H2_DIGEST_CAP - 1)] | d[(p + 5) & (2 * H2_DIGEST_CAP - 1)] << 8) + cnt;
    d[(p + 4) & (2 * H2_DIGEST_CAP - 1)] = plen;
    d[(p + 5) & (2 * H2_DIGEST_CAP - 1)] = plen >> 8;
    return cnt;
}

/* One step of the walk: the next iovec, or the bytes up to the next frame boundary (or
 * the rest of a frame header) in the current one. Returns 0 to go on, 1 when the
 * transfer is done, or 1 + an H2_STOP_* cause. */
static __always_inline int h2_step(struct h2_scratch *s, struct h2_transfer *t, struct h2_side *d,
                                   struct conn_state *st)
{
    if (t->pos >= t->ret)
        return 1;
    if (t->seg_off >= t->seg_len) { /* the next iovec */
        if (t->iov >= t->iovs || t->iov >= H2_WALK_IOVS)
            return 1 + H2_STOP_IOVS;
        u64 iov[2] = {};
        if (bpf_probe_read_user(iov, sizeof(iov), (void *)(t->buf + t->iov * sizeof(iov))) != 0)
            return 1 + H2_STOP_READ;
        t->iov++;
        t->seg = iov[0];
        t->seg_len = iov[1];
        t->seg_off = 0;
        return 0;
    }
    u64 avail = t->seg_len - t->seg_off;
    if (avail > t->ret - t->pos)
        avail = t->ret - t->pos;
    u64 src = t->seg + t->seg_off;
    u32 n;
    if (d->skip && !d->keep) { /* payload nobody parses (DATA...): skipped, the open piece ends */
        n = d->skip < avail ? d->skip : (u32)avail;
        d->skip -= n;
        t->piece = 0;
    } else {
        if (d->skip) { /* payload (or preface) bytes user space parses */
            n = d->keep < avail ? d->keep : (u32)avail;
        } else { /* a frame header's bytes: kept in part[] to read its length and type */
            u64 have = d->have, cnt = H2_HEADER - (u64)d->have;
            if (cnt > avail)
                cnt = avail;
            asm volatile("" : "+r"(have), "+r"(cnt)); /* the bounds below are what the verifier sees */
            if (have >= H2_HEADER || cnt > H2_HEADER || cnt == 0)
                return 1 + H2_STOP_READ;
            if (bpf_probe_read_user(d->part + have, cnt, (void *)src) != 0)
                return 1 + H2_STOP_READ;
            n = cnt;
        }
        long got = h2_copy(s, t, src, n);
        if (got < 0)
            return 1 + H2_STOP_READ;
        if (got == 0) { /* this record is full: the next one goes on */
            if (t->records + 1 >= H2_DIGEST_RECORDS)
                return 1 + H2_STOP_ROOM;
            h2_send(s, t, st, 0, 1);
            return 0;
        }
        n = got;
        if (d->skip) {
            d->skip -= n;
            d->keep -= n;
        } else if ((d->have += n) == H2_HEADER) {
            u32 len = (u32)d->part[0] << 16 | (u32)d->part[1] << 8 | d->part[2];
            d->skip = len;
            d->keep = h2_kept(d->part[3], len);
            d->have = 0;
        }
    }
    t->pos += n;
    t->seg_off += n;
    return 0;
}

/* Never attached: io_done tail-calls it for a transfer of a walked HTTP/2 connection. */
int h2_walk(void *ctx)
{
    u32 zero = 0;
    struct h2_transfer *t = h2_transfers.lookup(&zero);
    struct h2_scratch *s = h2_scratch.lookup(&zero);
    if (!t || !s)
        return 0;
    struct conn_key key = {.tgid = t->id >> 32, .fd = t->fd};
    struct conn_state *st = conns.lookup(&key);
    struct h2_walk *w = h2_walks.lookup(&key);
    if (!st || !w)
        return 0;
    struct h2_side *d = t->kind == EV_SOCK_READ ? &w->side[0] : &w->side[1];
    if (t->at == 0) /* the transfer's first run */
        t->at = H2_DIGEST_HEAD;
    int r = d->stop ? 1 + d->stop : 0;
    for (int i = 0; i < H2_WALK_STEPS && r == 0; i++)
        r = h2_step(s, t, d, st);
    if (r == 0) { /* steps left: a new run goes on; it returns only past the tail-call limit */
        h2_walkers.call(ctx, 0);
        r = 1 + H2_STOP_STEPS;
    }
    if (r > 1 && !d->stop)
        d->stop = r - 1;
    h2_send(s, t, st, d->stop, 0);
    return 0;
}
