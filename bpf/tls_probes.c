/* TLS plaintext: uprobes on OpenSSL's SSL_read/SSL_read_ex/SSL_write/SSL_write_ex
 * (entry: the SSL* and the buffer; return: the byte count) in the libssl of traced
 * processes. Their plaintext goes out as the syscall probes' records (the same
 * emit_sock_io, flag EV_FLAG_TLS) on the connection's fd, so the stitcher frames and
 * attributes HTTPS exactly as cleartext; the ciphertext of that fd is never sent.
 *
 * Which fd an SSL* is (ssl_fds):
 *  - a socket BIO (blocking servers: ssl-wrapped sockets, gunicorn): SSL_read,
 *    SSL_write and SSL_do_handshake make the read()/write() themselves, on this
 *    thread: http_probes.c io_enter ties the SSL* in progress (tls_calls) to that fd;
 *  - a memory BIO (asyncio/uvloop sslproto): the loop reads the ciphertext first,
 *    then calls SSL_do_handshake/SSL_read on the same thread in the same callback:
 *    an SSL* with no fd is tied at its first call to the TLS connection this thread
 *    last read that has no SSL* yet (tls_last_read), once.
 * Comes after http_probes.c (conns, emit_sock_io). */
#include "maps.h"

static __always_inline void tls_enter(struct pt_regs *ctx, u32 call, u64 done_ptr)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    if (!is_traced_now(tgid))
        return; /* libssl is probed for every process mapping it: one inlined read here */
    u64 ssl = PT_REGS_PARM1(ctx);
    if (call == TLS_CALL_HANDSHAKE && tls_calls.lookup(&id))
        return; /* a handshake inside SSL_read/SSL_write: that call's entry stays */
    struct tls_call c = {.ssl = ssl, .buf = PT_REGS_PARM2(ctx), .done_ptr = done_ptr, .call = call};
    tls_calls.update(&id, &c);
    struct ssl_key k = {.tgid = tgid, .ssl = ssl};
    if (ssl_fds.lookup(&k))
        return;
    s32 *last = tls_last_read.lookup(&id);
    if (!last)
        return;
    struct conn_key ck = {.tgid = tgid, .fd = *last};
    tls_last_read.delete(&id); /* one SSL* per read connection */
    struct conn_state *st = conns.lookup(&ck);
    if (st && st->tls && !st->ssl)
        tls_tie(tgid, ssl, ck.fd, st);
}

static __always_inline void tls_return(struct pt_regs *ctx, u32 call)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!maybe_traced(id >> 32))
        return;
    struct tls_call *cp = tls_calls.lookup(&id);
    if (!cp || cp->call != call)
        return;
    struct tls_call c = *cp;
    tls_calls.delete(&id);
    if (call == TLS_CALL_HANDSHAKE)
        return;
    long ret = PT_REGS_RC(ctx);
    u64 n = 0;
    if (c.done_ptr) { /* SSL_read_ex/SSL_write_ex: 1 on success, the count through the pointer */
        if (ret != 1 || bpf_probe_read_user(&n, sizeof(n), (void *)c.done_ptr) != 0)
            return;
    } else if (ret > 0) {
        n = (u64)ret;
    }
    if (n == 0)
        return;
    u32 tgid = id >> 32;
    struct ssl_key k = {.tgid = tgid, .ssl = c.ssl};
    s32 *fd = ssl_fds.lookup(&k);
    if (!fd) { /* a client connection of the process, or an SSL* never tied */
        count(CNT_TLS_UNTIED);
        return;
    }
    struct conn_key ck = {.tgid = tgid, .fd = *fd};
    struct conn_state *st = conns.lookup(&ck);
    if (!st || st->state == CONN_OTHER)
        return;
    u8 kind = call == TLS_CALL_READ ? EV_SOCK_READ : EV_SOCK_WRITE;
    int slot = scratch_claim(SCRATCH_TLS);
    if (slot < 0) {
        /* Dropped (counted: scratch_busy) as if the ring buffer were full: the connection
         * says so in its next record, and the kernel summarises the request it belonged
         * to, so its framing never runs on with bytes missing. */
        if (st->state == CONN_HTTP)
            record_sent(tgid, &st->req, -1, request_boundary(tgid, &st->req, kind, bpf_ktime_get_ns()), 0);
        return;
    }
    u32 i = slot;
    struct sock_io_scratch *scratch = tls_scratch.lookup(&i);
    if (scratch) {
        write_tail(scratch, kind, c.buf, (long)n);
        emit_sock_io(scratch, kind, id, &ck, st, c.buf, n, (long)n, EV_FLAG_TLS);
    }
    scratch_release(SCRATCH_TLS, i);
}

/* SSL_read(ssl, buf, num) and SSL_write(ssl, buf, num): the count is the return value. */
int tls_read_enter(struct pt_regs *ctx) { tls_enter(ctx, TLS_CALL_READ, 0); return 0; }
int tls_read_return(struct pt_regs *ctx) { tls_return(ctx, TLS_CALL_READ); return 0; }
int tls_write_enter(struct pt_regs *ctx) { tls_enter(ctx, TLS_CALL_WRITE, 0); return 0; }
int tls_write_return(struct pt_regs *ctx) { tls_return(ctx, TLS_CALL_WRITE); return 0; }
/* SSL_read_ex(ssl, buf, num, size_t *readbytes), SSL_write_ex(ssl, buf, num, size_t *written). */
int tls_read_ex_enter(struct pt_regs *ctx) { tls_enter(ctx, TLS_CALL_READ, PT_REGS_PARM4(ctx)); return 0; }
int tls_write_ex_enter(struct pt_regs *ctx) { tls_enter(ctx, TLS_CALL_WRITE, PT_REGS_PARM4(ctx)); return 0; }
/* SSL_do_handshake(ssl): its syscalls tie a socket BIO; a memory BIO ties at entry. */
int tls_handshake_enter(struct pt_regs *ctx) { tls_enter(ctx, TLS_CALL_HANDSHAKE, 0); return 0; }
int tls_handshake_return(struct pt_regs *ctx) { tls_return(ctx, TLS_CALL_HANDSHAKE); return 0; }

/* SSL_free(ssl): its tie goes (the connection keeps its tls mark until close). */
int tls_free(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!maybe_traced(id >> 32))
        return 0;
    struct ssl_key k = {.tgid = id >> 32, .ssl = PT_REGS_PARM1(ctx)};
    s32 *fd = ssl_fds.lookup(&k);
    if (!fd)
        return 0;
    struct conn_key ck = {.tgid = k.tgid, .fd = *fd};
    struct conn_state *st = conns.lookup(&ck);
    if (st && st->ssl == k.ssl)
        st->ssl = 0;
    ssl_fds.delete(&k);
    return 0;
}
