/* Device-clock mode (otel_gpu/device_clock): GPU activity timed by the device. The CUPTI
 * injection library a service loads (cupti/otel_gpu_cupti.c) hands its records, up to
 * DEVICE_RECORDS_PER_CALL at a time, to otel_gpu_device_records(records, count, dropped), a
 * no-op whose entry this probe reads: one ring record per call, so a probe hit costs the
 * library's flush thread, never a launching thread. */
#include "maps.h"

int device_records(struct pt_regs *ctx)
{
    u64 id = bpf_get_current_pid_tgid();
    if (!is_traced_now(id >> 32))
        return 0;
    u32 n = (u32)PT_REGS_PARM2(ctx);
    if (n > DEVICE_RECORDS_PER_CALL) /* not ours to trust beyond the array the event holds */
        n = DEVICE_RECORDS_PER_CALL;
    asm volatile("" : "+r"(n)); /* keeps the bound: else clang folds it into the loop below, and the
                                 * verifier, which sees only the loop's count, refuses the copy */
    struct device_records_event *e = events.ringbuf_reserve(sizeof(struct device_records_event));
    if (!e) {
        count(CNT_RINGBUF_FULL);
        return 0;
    }
    fill_header(&e->h, EV_DEVICE_RECORDS, id);
    e->count = n;
    e->pad = 0;
    e->dropped = PT_REGS_PARM3(ctx);
    const struct device_record *from = (const void *)PT_REGS_PARM1(ctx);
    /* One record a read: a constant size the verifier checks against the event (a bounded
     * loop, not unrolled: the kernels otel-gpu runs on verify those). */
    for (u32 i = 0; i < DEVICE_RECORDS_PER_CALL; i++) {
        if (i >= n)
            break;
        if (bpf_probe_read_user(&e->records[i], sizeof(e->records[i]), &from[i]) != 0) {
            e->h.flags |= EV_FLAG_UNREADABLE; /* user space drops the batch and counts it */
            e->count = 0;
            break;
        }
    }
    events.ringbuf_submit(e, 0);
    return 0;
}
