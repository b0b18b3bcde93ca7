/* A CUDA library being loaded: one uprobe on each probed library's DT_INIT, which
 * the dynamic loader runs once per process and load (otel_gpu/probes/elf_init.py).
 * It fires before the process can make its first CUDA call or accept its first
 * connection, so with TRACE_ALL the process is traced from then on; either way user
 * space is told (`loaded`) and scans that one process at once (Python contexts,
 * --pid/--exe filters and per-process probes) instead of at its next /proc scan. */
#include "maps.h"

/* tgid -> 0: processes that loaded a CUDA library since user space last looked.
 * Full: the process waits for the periodic /proc scan, as before this probe. */
BPF_HASH(loaded, u32, u32, 1024);

int cuda_library_loaded(struct pt_regs *ctx)
{
    u32 tgid = bpf_get_current_pid_tgid() >> 32;
    u32 zero = 0;
#if TRACE_ALL
    u32 one = TRACED;
    traced.lookup_or_try_init(&tgid, &one);
    pid_mark(tgid, PID_TRACED);
#endif
    loaded.update(&tgid, &zero);
    return 0;
}
