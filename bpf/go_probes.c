/* Go goroutines: which goroutine a thread of a traced Go process runs, for the CUDA
 * and socket records (their `ctx`, GO_UNIT | goid). Goroutines move between OS threads
 * at every park, so the thread says nothing about the request; the goroutine does.
 * Read from the thread itself at each record, no probe on the Go runtime: its TLS g
 * (FS base + tls_g), then g.m.curg. In Go code TLS g is the running goroutine (its
 * m.curg is itself); during a cgo call, where every CUDA call from Go is made, TLS g is
 * the thread's g0 and m.curg the goroutine that called (FS base: maps.h's
 * thread_pointer()). Comes after python_probes.c (exec_unit() asks it first) and
 * before the HTTP and CUDA probes. */
#include "maps.h"

/* tgid -> runtime layout; set by user space for a recognised Go executable. */
BPF_HASH(go_procs, u32, struct go_proc, MAX_PROCS);

/* GO_UNIT | the running goroutine's id; 0 when not known (not a Go thread yet: a C
 * thread, or a thread between goroutines). */
static __always_inline u64 go_goroutine(struct go_proc *p)
{
    u64 fsbase = thread_pointer(), g = 0, m = 0, curg = 0, goid = 0;
    if (!fsbase || bpf_probe_read_user(&g, sizeof(g), (void *)(fsbase + p->tls_g)) || !g)
        return 0;
    if (bpf_probe_read_user(&m, sizeof(m), (void *)(g + p->g_m)) || !m)
        return 0;
    if (bpf_probe_read_user(&curg, sizeof(curg), (void *)(m + p->m_curg)) || !curg)
        return 0;
    if (bpf_probe_read_user(&goid, sizeof(goid), (void *)(curg + p->g_goid)) || !goid)
        return 0;
    return GO_UNIT | goid;
}

/* The execution unit of the current thread of a traced process: its Python context,
 * or its goroutine, or 0 (a plain OS thread: the stitcher's thread rules). */
static __always_inline u64 exec_unit(u32 tgid, u32 tid)
{
    u64 py = py_context(tgid, tid);
    if (py)
        return py;
    struct go_proc *p = go_procs.lookup(&tgid);
    return p ? go_goroutine(p) : 0;
}

/* Goroutine lineage and hand-offs, from two runtime functions (addresses from
 * .gopclntab: probes/go_functions.py). Go code is called with the register ABI:
 * newproc1(fn, callergp, ...) and runqput(pp, gp, next) have gp in RBX. `go f()` runs
 * newproc1 then runqput(new g) on the creator's thread (the creator is m.curg);
 * every other runqput is a wake-up (ready(): a channel send, a mutex unlock), made by
 * m.curg, or by no goroutine at all (the scheduler, netpoll, timers: curg is 0).
 * Streamed while the process has HTTP activity, as Python's context copies are. */

/* pid_tgid -> 1 between newproc1 and the runqput of the goroutine it made. LRU: a
 * newproc1 that puts nothing on a run queue (a coroutine) leaves no leak. */
BPF_TABLE("lru_hash", u64, u8, go_spawning, 16384);
/* (tgid, waker goid, woken goid) already reported: one record per pair of goroutines. */
struct go_wake_key {
    u32 tgid;
    u32 pad;
    u64 waker;
    u64 woken;
};
BPF_TABLE("lru_hash", struct go_wake_key, u8, go_wakes, 65536);

static __always_inline struct go_proc *go_streaming(u32 tgid)
{
    struct go_proc *p = go_procs.lookup(&tgid);
    if (!p || !p->g_parent_goid)
        return 0;
    s64 *active = http_active.lookup(&tgid);
    return active && *active > 0 ? p : 0;
}

int go_newproc1(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!go_streaming(id >> 32))
        return 0;
    u8 one = 1;
    go_spawning.update(&id, &one);
    return 0;
}

int go_runqput(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    struct go_proc *p = go_streaming(tgid);
    if (!p)
        return 0;
    u8 *spawning = go_spawning.lookup(&id);
    u8 spawn = spawning && *spawning;
    if (spawning)
        go_spawning.delete(&id);
    u64 me = go_goroutine(p);
    u64 gp = ctx->bx, goid = 0, parent = 0;
    if (!me || !gp || bpf_probe_read_user(&goid, sizeof(goid), (void *)(gp + p->g_goid)) || !goid)
        return 0;
    bpf_probe_read_user(&parent, sizeof(parent), (void *)(gp + p->g_parent_goid));
    goid |= GO_UNIT;
    if (goid == me)
        return 0;
    u32 type = EV_GO_WAKE;
    if (spawn && (parent | GO_UNIT) == me) {
        type = EV_GO_SPAWN;
    } else {
        struct go_wake_key key = {.tgid = tgid, .waker = me, .woken = goid};
        if (go_wakes.lookup(&key))
            return 0;
        u8 one = 1;
        go_wakes.update(&key, &one);
    }
    struct py_context_event e = {};
    fill_header(&e.h, type, id);
    e.ctx = goid;
    e.parent = me;
    epoch_submit(&e, sizeof(e), &e.h, 0); /* a new binding: calls counted before it stay before it */
    return 0;
}

/* Go's HTTP/2 server (net/http's bundled copy, net/http/internal/http2 from Go 1.27,
 * golang.org/x/net/http2): per connection, its serverConn `sc` reads every frame in a
 * goroutine of its own, `go sc.readFrames()`, and starts each stream's handler in a new
 * goroutine, `go sc.runHandler(rw, req, handler)`, with rw.rws.stream.id its stream
 * (responseWriter{rws}, responseWriterState{stream, ...}, stream{sc, id uint32}: the
 * same first fields in every release). Both run at the entry of the goroutine they
 * name; the register ABI puts the receiver sc in RAX and rw in RBX. User space then
 * knows the connection of sc (the reader's reads) and binds the handler goroutine to its
 * stream's request: proof, not timing (pipeline/contexts.py). Once per connection and
 * per stream, whatever the HTTP state. */
static __always_inline int go_h2_submit(struct pt_regs *ctx, u64 conn, u32 stream)
{
    u64 id = bpf_get_current_pid_tgid();
    u32 tgid = id >> 32;
    struct go_proc *p = go_procs.lookup(&tgid);
    if (!p || !conn)
        return 0;
    struct go_h2_event e = {};
    e.unit = go_goroutine(p);
    if (!e.unit)
        return 0;
    fill_header(&e.h, EV_GO_H2_UNIT, id);
    e.conn = conn;
    e.stream = stream;
    epoch_submit(&e, sizeof(e), &e.h, 0); /* a new binding: calls counted before it stay before it */
    return 0;
}

int go_h2_reader(struct pt_regs *ctx)
{
    return go_h2_submit(ctx, ctx->ax, 0);
}

int go_h2_handler(struct pt_regs *ctx)
{
    u64 rws = 0, stream = 0;
    u32 sid = 0;
    if (bpf_probe_read_user(&rws, sizeof(rws), (void *)ctx->bx) || !rws ||
        bpf_probe_read_user(&stream, sizeof(stream), (void *)rws) || !stream ||
        bpf_probe_read_user(&sid, sizeof(sid), (void *)(stream + 8)) || !sid)
        return 0;
    return go_h2_submit(ctx, ctx->ax, sid);
}
