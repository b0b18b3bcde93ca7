/* Maps and helpers shared by the HTTP and CUDA probes. Tunables arrive as -D cflags
 * from otel_gpu/probes/source.py, which also prepends the generated CALL_* ids. */
#ifndef OTEL_GPU_MAPS_H
#define OTEL_GPU_MAPS_H

#include <uapi/linux/ptrace.h>
#include <linux/sched.h>
#include "events.h"

/* RINGBUF_PAGES and MAX_CONNS size maps only: a program from the cache has its maps made
 * at the configured sizes (probes/source.py map_sizes), so these are the sizes compiled
 * in, changed by -D flags only where nothing is cached (--bpf-cache off). */
#ifndef RINGBUF_PAGES
#define RINGBUF_PAGES 2048
#endif
#ifndef MAX_PROCS
#define MAX_PROCS 4096
#endif
#ifndef MAX_CONNS
#define MAX_CONNS 65536
#endif
#ifndef AGG_ENTRIES
#define AGG_ENTRIES 65536
#endif
/* The hashes whose entries are made as they are needed, not preallocated for the worst
 * case: kernel memory follows use (a 65536-entry preallocated table holds 5-10 MB,
 * per CPU for a per-CPU one), and max_entries is still the limit, counted where an
 * insert finds it reached. The kernel preallocates LRU hashes whatever the flag.
 * Measured by otel_gpu/kernel_io/map_memory.py (otel-gpu status, bench item 4). */
#ifndef BY_NEED
#define BY_NEED BPF_F_NO_PREALLOC
#endif
/* 1: the sched tracepoints keep traced threads' time (bpf/sched_probes.c): --time-split. */
#ifndef TIME_SPLIT
#define TIME_SPLIT 0
#endif
/* 1: every process that calls a CUDA probe is traced (no --pid/--exe filter). */
#ifndef TRACE_ALL
#define TRACE_ALL 1
#endif

/* offsetof(struct task_struct, thread.fsbase), from the running kernel's BTF
 * (probes/kernel_btf.py); -1 where there is none: no goroutines, no Python contexts. */
#ifndef TASK_FSBASE_OFFSET
#define TASK_FSBASE_OFFSET -1
#endif
/* offsetof(struct task_struct, pid), tgid and its state, likewise: the raw sched
 * tracepoints (bpf/sched_probes.c) read them; -1: no time split. */
#ifndef TASK_PID_OFFSET
#define TASK_PID_OFFSET -1
#endif
#ifndef TASK_TGID_OFFSET
#define TASK_TGID_OFFSET -1
#endif
#ifndef TASK_STATE_OFFSET
#define TASK_STATE_OFFSET -1
#endif
/* offsetof(struct task_struct, files), (files_struct, fdt), (fdtable, max_fds), (fdtable,
 * fd), (file, f_inode) and (inode, i_ino), likewise: fd_ino below; -1: no BTF. */
#ifndef TASK_FILES_OFFSET
#define TASK_FILES_OFFSET -1
#endif
#ifndef FILES_FDT_OFFSET
#define FILES_FDT_OFFSET -1
#endif
#ifndef FDT_MAX_FDS_OFFSET
#define FDT_MAX_FDS_OFFSET -1
#endif
#ifndef FDT_FD_OFFSET
#define FDT_FD_OFFSET -1
#endif
#ifndef FILE_INODE_OFFSET
#define FILE_INODE_OFFSET -1
#endif
#ifndef INODE_INO_OFFSET
#define INODE_INO_OFFSET -1
#endif

BPF_RINGBUF_OUTPUT(events, RINGBUF_PAGES);

/* The current thread's FS base: its thread pointer (glibc's and musl's pthread_self(),
 * where Go keeps TLS g); 0 when not known. */
static __always_inline u64 thread_pointer(void)
{
    u64 fsbase = 0;
    if (TASK_FSBASE_OFFSET < 0)
        return 0;
    void *task = (void *)bpf_get_current_task();
    bpf_probe_read_kernel(&fsbase, sizeof(fsbase), task + TASK_FSBASE_OFFSET);
    return fsbase;
}

/* The inode number of the file the current process has at `fd` now (a socket's is the
 * N of /proc's "socket:[N]", never reused while the socket lives), or 0: none, or no
 * offsets from the kernel's BTF. Its number, not its struct file *: a file closed
 * synchronously can be reallocated at the same address at once. */
static __always_inline u64 fd_ino(s32 fd)
{
#if TASK_FILES_OFFSET >= 0 && FILES_FDT_OFFSET >= 0 && FDT_MAX_FDS_OFFSET >= 0 && FDT_FD_OFFSET >= 0 \
    && FILE_INODE_OFFSET >= 0 && INODE_INO_OFFSET >= 0
    void *task = (void *)bpf_get_current_task(), *files = 0, *fdt = 0, *slots = 0, *file = 0, *inode = 0;
    u64 ino = 0;
    u32 max_fds = 0;
    bpf_probe_read_kernel(&files, sizeof(files), task + TASK_FILES_OFFSET);
    if (files)
        bpf_probe_read_kernel(&fdt, sizeof(fdt), files + FILES_FDT_OFFSET);
    if (!fdt)
        return 0;
    bpf_probe_read_kernel(&max_fds, sizeof(max_fds), fdt + FDT_MAX_FDS_OFFSET);
    bpf_probe_read_kernel(&slots, sizeof(slots), fdt + FDT_FD_OFFSET);
    if (fd < 0 || (u32)fd >= max_fds || !slots)
        return 0;
    bpf_probe_read_kernel(&file, sizeof(file), slots + (u64)fd * sizeof(void *));
    if (file)
        bpf_probe_read_kernel(&inode, sizeof(inode), file + FILE_INODE_OFFSET);
    if (inode)
        bpf_probe_read_kernel(&ino, sizeof(ino), inode + INODE_INO_OFFSET);
    return ino;
#else
    return 0;
#endif
}

/* Unread bytes in `events`. bcc rewrites only the map methods it knows, and
 * ringbuf_query is not one: a ringbuf_output call with this flag becomes the query
 * (the macro applies in bcc's second pass, once the map is named by its fd). */
#define RINGBUF_QUERY_FLAG 0x7a11
#define bpf_ringbuf_output(map, data, size, flags)                                      \
    ((flags) == RINGBUF_QUERY_FLAG ? (long)bpf_ringbuf_query(map, BPF_RB_AVAIL_DATA)    \
                                   : bpf_ringbuf_output(map, data, size, flags))
static __always_inline u64 ring_unread(void)
{
    u32 dummy = 0;
    return (u64)events.ringbuf_output(&dummy, 0, RINGBUF_QUERY_FLAG);
}

/* Processes being traced: tgid -> TRACED, or (user space, for a GPU process
 * related to HTTP servers: otel_gpu/pipeline/groups.py) the tgid of the one related
 * server whose HTTP activity also streams its CUDA calls, or FOLLOW_ALL (several
 * related servers: always streamed). Filled by user space (discovery, filters) and,
 * with TRACE_ALL, by the CUDA probes themselves (TRACED). */
BPF_HASH(traced, u32, u32, MAX_PROCS);
#define TRACED 1
#define FOLLOW_ALL 0xffffffffu

/* Processes with at least one server connection that carried an HTTP request:
 * tgid -> number of such connections. While non-zero, CUDA calls are streamed
 * so user space can attribute them; otherwise they are only counted. */
BPF_HASH(http_active, u32, s64, MAX_PROCS);
/* tgid -> 1 while every request the process has open is unsampled (set by user space,
 * pipeline/sampling.py): its calls are counted in req_agg, never streamed one by one, so
 * the collector's work follows the sampled rate. */
BPF_HASH(quiet_procs, u32, u8, MAX_PROCS);

/* Fibonacci hashing: a key times this, its top bits the slot (the direct-mapped caches:
 * launch_pair_cache, verdict_slots). */
#define FIB_MIX 0x9E3779B97F4A7C15ULL

/* By tgid (struct http_seq): the HTTP epoch and read count of a process. */
BPF_HASH(http_seq, u32, struct http_seq, MAX_PROCS);
/* A word per process, by its pid's low bits, that every change of its http_seq bumps
 * first (epoch, reads, unseen): a thread's standing verdict (bpf/request_counts.c) holds
 * while the word is as it was, told by an inlined array read instead of a hash lookup of
 * http_seq at every call. Processes that share a word only decide again more often. */
#define SEQ_WORDS_LOG2 16
BPF_ARRAY(http_seq_words, u32, 1 << SEQ_WORDS_LOG2);

static __always_inline u32 *seq_word(u32 tgid)
{
    u32 i = tgid & ((1 << SEQ_WORDS_LOG2) - 1);
    return http_seq_words.lookup(&i);
}

static __always_inline void seq_word_bump(u32 tgid)
{
    u32 *w = seq_word(tgid);
    if (w)
        __sync_fetch_and_add(w, 1);
}

BPF_PERCPU_ARRAY(counters, u64, CNT_MAX);

/* TLS (bpf/tls_probes.c), here because the syscall probes use them too. */
#define TLS_CALL_READ 1
#define TLS_CALL_WRITE 2
#define TLS_CALL_HANDSHAKE 3
struct tls_call {    /* an SSL_read/SSL_write/SSL_do_handshake in progress on a thread */
    u64 ssl;         /* SSL* */
    u64 buf;         /* plaintext buffer */
    u64 done_ptr;    /* the _ex variants' size_t *readbytes/written; 0: the count is the return */
    u32 call;        /* TLS_CALL_* */
    u32 pad;
};
/* pid_tgid -> its SSL call in progress: a syscall on a connection made inside it is
 * that SSL*'s socket (a socket BIO). LRU: a thread killed mid-call leaves no leak. */
BPF_TABLE("lru_hash", u64, struct tls_call, tls_calls, 4096);
struct ssl_key {
    u32 tgid;
    u32 pad;
    u64 ssl;
};
/* (tgid, SSL*) -> the connection's fd. Bounded like the connection table, whose
 * entry names the SSL* back (conn_state.ssl): both go at close and SSL_free. */
BPF_F_TABLE("hash", struct ssl_key, s32, ssl_fds, MAX_CONNS, BY_NEED);
/* pid_tgid -> the last TLS connection whose ciphertext the thread read outside an SSL
 * call (a memory BIO: asyncio, uvloop): an SSL* first used on that thread with no
 * socket of its own is that connection's. */
BPF_TABLE("lru_hash", u64, s32, tls_last_read, 4096);

/* Atomic, though the counters are per CPU: a uprobe program can be preempted, and
 * another program on the CPU count meanwhile (see scratch_claim). */
static __always_inline void count(u32 idx)
{
    u64 *v = counters.lookup(&idx);
    if (v)
        __sync_fetch_and_add(v, 1);
}

/* Scratch for records larger than the 512-byte stack, filled by uprobe programs (the
 * SSL probes, the kernel-handle returns). A uprobe program runs with migration
 * disabled, not preemption (a kernel booted preempt=full, or built preemptible):
 * another program can run on the CPU while one is filling its scratch, and would write
 * over it. So each kind has SCRATCH_SLOTS per CPU, each taken by a compare-and-swap on
 * its scratch_busy word and given back after the submit. Tracepoint programs run with
 * preemption disabled: their scratch (io_scratch) needs no claim. */
#define SCRATCH_SLOTS 4
#define SCRATCH_TLS 0                 /* tls_scratch's slots in scratch_busy */
#define SCRATCH_HANDLES SCRATCH_SLOTS /* handle_scratch's */
BPF_PERCPU_ARRAY(scratch_busy, u64, 2 * SCRATCH_SLOTS);

/* A free slot of the kind starting at `first`, taken: its index from `first`, or -1
 * (all held: counted, the record is dropped). */
static __always_inline int scratch_claim(u32 first)
{
#pragma unroll
    for (u32 i = 0; i < SCRATCH_SLOTS; i++) {
        u32 slot = first + i;
        u64 *busy = scratch_busy.lookup(&slot);
        if (busy && __sync_val_compare_and_swap(busy, 0, 1) == 0)
            return i;
    }
    count(CNT_SCRATCH_BUSY);
    return -1;
}

static __always_inline void scratch_release(u32 first, u32 i)
{
    u32 slot = first + i;
    u64 *busy = scratch_busy.lookup(&slot);
    if (busy)
        *busy = 0;
}

static __always_inline void fill_header(struct event_header *h, u8 kind, u64 pid_tgid)
{
    h->kind = kind;
    h->flags = 0;  /* per-CPU scratch records keep the last event's values otherwise */
    h->epoch = 0;
    h->tgid = pid_tgid >> 32;
    h->tid = (u32)pid_tgid;
    h->ts_ns = bpf_ktime_get_ns();
}

static __always_inline int is_traced(u32 tgid)
{
    return traced.lookup(&tgid) != NULL;
}

/* The question every syscall tracepoint asks for every process on the host, and the
 * launch probe for every launch: two bits per tgid in an array, whose lookup the
 * verifier inlines (a few ns, where a hash lookup costs ~20). Per tgid, one word of
 * each writer, so that no word has two writers that could lose each other's bits:
 *   PID_USER (otel_gpu/probes/pid_bits.py): TRACED: trace()/follow(); SLOW: it follows
 *     a server (its calls may stream while it has no HTTP activity of its own);
 *   PID_KERNEL: TRACED: traced by its first CUDA call or library load (TRACE_ALL);
 *     SLOW: it has had HTTP activity (sticky: clearing it would race the next
 *     connection). Both clear at exit (the pid may be reused).
 * A writer sets SLOW before, and clears it after, the state it announces. No bit is
 * exact "not traced": a set TRACED bit is confirmed with `traced` where it matters.
 * Pids from pid_max at start up (PID_WORDS * 32) take the full path. */
#ifndef PID_WORDS
#define PID_WORDS 1024
#endif
#define PID_USER 0
#define PID_KERNEL 1
#define PID_TRACED 1
#define PID_SLOW 2
BPF_ARRAY(pid_bits, u64, 2 * PID_WORDS);

static __always_inline u64 *pid_word(u32 tgid, u32 writer)
{
    u32 i = writer * PID_WORDS + (tgid >> 5);
    return pid_bits.lookup(&i);
}

/* PID_TRACED | PID_SLOW as both writers have them (both for a pid beyond the array). */
static __always_inline u64 pid_flags(u32 tgid)
{
    if (tgid >= PID_WORDS * 32)
        return PID_TRACED | PID_SLOW;
    u64 *u = pid_word(tgid, PID_USER), *k = pid_word(tgid, PID_KERNEL);
    u64 both = (u ? *u : 0) | (k ? *k : 0);
    return (both >> ((tgid & 31) * 2)) & 3;
}

/* User space's TRACED bit alone: it knows the process (it will read its last counts). */
static __always_inline int user_traced(u32 tgid)
{
    u64 *u = tgid < PID_WORDS * 32 ? pid_word(tgid, PID_USER) : NULL;
    return u && (*u >> ((tgid & 31) * 2)) & PID_TRACED;
}

/* The kernel's word of tgid, or NULL beyond the array. */
static __always_inline u64 *kernel_word(u32 tgid)
{
    return tgid < PID_WORDS * 32 ? pid_word(tgid, PID_KERNEL) : NULL;
}

static __always_inline void pid_mark(u32 tgid, u64 flags)
{
    u64 bits = flags << ((tgid & 31) * 2), *w = kernel_word(tgid);
    if (w && (*w & bits) != bits) /* read-only once set: no shared cache-line write per call */
        __sync_fetch_and_or(w, bits);
}

static __always_inline void pid_unmark(u32 tgid)
{
    u64 bits = 3ull << ((tgid & 31) * 2), *w = kernel_word(tgid);
    if (w && (*w & bits))
        __sync_fetch_and_and(w, ~bits);
}

/* 0: certainly not traced (one inlined read); 1: maybe (a bit can outlive its entry). */
static __always_inline int maybe_traced(u32 tgid)
{
    return pid_flags(tgid) & PID_TRACED;
}

/* maybe_traced, confirmed by the `traced` lookup. */
static __always_inline int is_traced_now(u32 tgid)
{
    return maybe_traced(tgid) && is_traced(tgid);
}

/* 0, or -1 when the ring buffer had no room (counted). */
static __always_inline int submit(void *data, u32 size)
{
    if (events.ringbuf_output(data, size, 0) != 0) {
        count(CNT_RINGBUF_FULL);
        return -1;
    }
    return 0;
}

/* A record that changes what a call would be attributed to (an HTTP record; a context
 * copy or goroutine start or wake-up, which binds an execution unit): bumps the
 * process's epoch first and carries the new value, so user space places the req_agg
 * counts of older epochs before it, where the bindings they were made under still hold
 * (a context's id is its address: a freed one comes back for the next request). `read`:
 * a read of an HTTP connection, which also starts new budgets for the process's threads. */
static __always_inline int epoch_submit(void *data, u32 size, struct event_header *h, int read)
{
    u32 tgid = h->tgid;
    struct http_seq zero = {};
    seq_word_bump(tgid);
    struct http_seq *s = http_seq.lookup_or_try_init(&tgid, &zero);
    if (s) {
        if (read)
            __sync_fetch_and_add(&s->reads, 1);
        /* Not atomic (this kernel's BPF cannot use an atomic add's result): two HTTP
         * records of one process at the same instant may share an epoch, which
         * still orders every count before or after both. */
        h->epoch = s->epoch + 1;
        s->epoch = h->epoch;
    }
    return submit(data, size);
}

/* A change that bumps no record's epoch but ends what was decided under the current
 * one (bpf/request_counts.c). The next record carries a later epoch all the same. */
static __always_inline void epoch_bump(u32 tgid)
{
    seq_word_bump(tgid);
    struct http_seq *s = http_seq.lookup(&tgid);
    if (s)
        s->epoch++;
}

#endif
