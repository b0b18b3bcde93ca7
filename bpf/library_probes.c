/* A CUDA library being loaded: one uprobe on each probed library's DT_INIT, which
 * the dynamic loader runs once per process and load (otel_gpu/probes/elf_init.py).
 * It fires before the process can make its first CUDA call or accept its first
 * connection, so with TRACE_ALL the process is traced from then on; either way user
 * space is told (`loaded`) and scans that one process at once (Python contexts,
 * --pid/--exe filters and per-process probes) instead of at its next /proc scan. */
#include "maps.h"

/* tgid -> the LIB_* bits of what it opened (events.h): processes that loaded (or opened:
 * below) a CUDA library since user space last looked. Full: the process waits for the
 * periodic /proc scan. */
BPF_HASH(loaded, u32, u64, 1024);  /* u64: the atomic OR below needs it */

/* A process entering `loaded` also sends a bare header (EV_LIBRARY_LOADED): user space reads
 * the table when told, instead of every tenth of a second (an idle node's collector woke
 * for nothing ten times a second). A record lost with a full ring waits for the next look.
 * One already waiting gains the new bits: a CUDA process opening the device-clock library
 * right after libcuda is scanned until it maps both. */
static __always_inline void loaded_add(u32 tgid, u64 opened)
{
    u64 *waiting = loaded.lookup(&tgid);
    if (waiting) {
        if ((*waiting & opened) != opened)
            __sync_fetch_and_or(waiting, opened);
        return;
    }
    if (loaded.insert(&tgid, &opened) != 0)
        return; /* full, or another of its threads inserted it this instant (the periodic scan) */
    struct event_header h = {};
    fill_header(&h, EV_LIBRARY_LOADED, bpf_get_current_pid_tgid());
    submit(&h, sizeof(h));
}

int cuda_library_loaded(struct pt_regs *ctx)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
#if TRACE_ALL
    u32 one = TRACED;
    traced.lookup_or_try_init(&tgid, &one);
    pid_mark(tgid, PID_TRACED);
#endif
    loaded_add(tgid, 0);
    return 0;
}

/* A library opened at any path: the open syscalls' tracepoints read each opened file's
 * name, and a process opening a CUDA runtime or driver, NCCL, ROCm's HIP runtime or RCCL, the
 * device-clock library
 * (or, once traced, an OpenSSL libssl) is put in `loaded` too. User space scans it at once and attaches
 * that file wherever it lies (a venv, a conda env, a container's overlay through
 * /proc/<pid>/root), within tens of milliseconds of the open, before the loader has
 * run the library's initialisers in most cases: no wait for the periodic /proc scan.
 * Cost on every open on the host: one read of the name and a scan back to its last
 * '/' (LIB_NAME_MAX bytes at most). */
#define LIB_PATH_MAX 512  /* a power of two: indexes are masked with it */
#define LIB_NAME_MAX 64   /* a longer basename is none of ours */

struct lib_path {
    char s[LIB_PATH_MAX];
};
BPF_PERCPU_ARRAY(lib_path_buf, struct lib_path, 1);

static __always_inline int name_is(const char *s, int at, const char *p, int len)
{
#pragma unroll
    for (int i = 0; i < len; i++)
        if (s[(at + i) & (LIB_PATH_MAX - 1)] != p[i])
            return 0;
    return 1;
}

static __always_inline void library_opened(const char *filename)
{
    u32 zero = 0;
    struct lib_path *buf = lib_path_buf.lookup(&zero);
    if (!buf)
        return;
    long n = bpf_probe_read_user_str(buf->s, sizeof(buf->s), filename);
    if (n < 2)
        return;
    int base = -1;
    for (int i = 2; i <= LIB_NAME_MAX + 1; i++) { /* s[n - 2] is the last character */
        int at = n - i;
        if (at < 0) {
            base = 0;
            break;
        }
        if (buf->s[at & (LIB_PATH_MAX - 1)] == '/') {
            base = at + 1;
            break;
        }
    }
    if (base < 0 || !name_is(buf->s, base, "lib", 3))
        return;
    base += 3;
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u64 opened = name_is(buf->s, base, "cudart", 6) ? LIB_CUDART
               : name_is(buf->s, base, "cuda.so", 7) ? LIB_DRIVER
               : name_is(buf->s, base, "nccl.so", 7) || name_is(buf->s, base, "rccl.so", 7) ? LIB_NCCL
               : name_is(buf->s, base, "amdhip64", 8) ? LIB_HIP
               : name_is(buf->s, base, "otel_gpu_cupti", 14) ? LIB_DEVICE_CLOCK
               : name_is(buf->s, base, "ssl.so", 6) && is_traced(tgid) ? LIB_SSL : 0;
    if (opened)
        loaded_add(tgid, opened);
}

TRACEPOINT_PROBE(syscalls, sys_enter_openat) { library_opened(args->filename); return 0; }
TRACEPOINT_PROBE(syscalls, sys_enter_open) { library_opened(args->filename); return 0; }

/* tgid -> 0: processes that called exec since user space last looked. A process the /proc
 * scan found using no CUDA is read again only when it is here (or QUIET_RESCAN_S later):
 * the scan no longer stats every process's executable to tell an exec. Full: its exec is
 * seen at that later read. One update per exec on the host. */
BPF_HASH(execed, u32, u32, 4096);

RAW_TRACEPOINT_PROBE(sched_process_exec)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 zero = 0;
    execed.update(&tgid, &zero);
    return 0;
}
