/* Go goroutines: which goroutine a thread of a traced Go process runs, for the CUDA
 * and socket records (their `ctx`, GO_UNIT | goid). Goroutines move between OS threads
 * at every park, so the thread says nothing about the request; the goroutine does.
 * Read from the thread itself at each record, no probe on the Go runtime: its TLS g
 * (FS base + tls_g), then g.m.curg. In Go code TLS g is the running goroutine (its
 * m.curg is itself); during a cgo call, where every CUDA call from Go is made, TLS g is
 * the thread's g0 and m.curg the goroutine that called. The FS base is the kernel's
 * task_struct.thread.fsbase, at TASK_FSBASE_OFFSET (from the running kernel's BTF:
 * probes/kernel_btf.py; -1 where there is none: no goroutines). Comes after
 * python_probes.c (exec_unit() asks it first) and before the HTTP and CUDA probes. */
#include "maps.h"

#ifndef TASK_FSBASE_OFFSET
#define TASK_FSBASE_OFFSET -1
#endif

/* tgid -> runtime layout; set by user space for a recognised Go executable. */
BPF_HASH(go_procs, u32, struct go_proc, MAX_PROCS);

/* GO_UNIT | the running goroutine's id; 0 when not known (not a Go thread yet: a C
 * thread, or a thread between goroutines). */
static __always_inline u64 go_goroutine(struct go_proc *p)
{
    if (TASK_FSBASE_OFFSET < 0)
        return 0;
    u64 fsbase = 0, g = 0, m = 0, curg = 0, goid = 0;
    void *task = (void *)bpf_get_current_task();
    bpf_probe_read_kernel(&fsbase, sizeof(fsbase), task + TASK_FSBASE_OFFSET);
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
