/* What libotel_gpu_cupti.so hands to otel_gpu_device_records(): one record per GPU activity
 * (kernel, memcpy, memset) that CUPTI reports. The collector reads these bytes with a uprobe on
 * that function, and its BPF side mirrors this layout field by field: change both or neither. */
#ifndef OTEL_GPU_DEVICE_RECORD_H
#define OTEL_GPU_DEVICE_RECORD_H

#include <stddef.h>
#include <stdint.h>

#define OTEL_GPU_DEVICE_KERNEL 1
#define OTEL_GPU_DEVICE_MEMCPY 2
#define OTEL_GPU_DEVICE_MEMSET 3

/* At most this many records per call: the uprobe copies a fixed-size array, a bound the BPF
 * verifier can check. */
#define OTEL_GPU_RECORDS_PER_CALL 16

struct otel_gpu_device_record {
    uint64_t start_ns;       /* device start, CLOCK_MONOTONIC ns (converted from CUPTI's clock) */
    uint64_t end_ns;         /* device end, same clock */
    uint64_t api_ns;         /* CLOCK_MONOTONIC ns when the launching API call entered (CUPTI callback), 0 if not known */
    uint64_t bytes;          /* memcpy/memset bytes; 0 for a kernel */
    uint32_t correlation_id; /* CUPTI's */
    uint32_t tid;            /* the launching thread (gettid()), 0 when not known */
    uint32_t stream_id;
    uint32_t device_id;
    uint8_t kind;            /* OTEL_GPU_DEVICE_KERNEL 1, _MEMCPY 2, _MEMSET 3 */
    uint8_t copy_kind;       /* CUPTI's memcpy kind for a memcpy, else 0 */
    uint8_t api_domain;      /* the launching call's CUpti_CallbackDomain (driver 1, runtime 2), 0 if not known */
    uint8_t pad1;
    uint32_t api_id;         /* its callback id in that domain (cupti_runtime_cbid.h, cupti_driver_cbid.h) */
    uint8_t pad[8];          /* to 64 bytes: a power of two, one cache line */
};

_Static_assert(sizeof(struct otel_gpu_device_record) == 64, "the BPF side mirrors 64 bytes");
_Static_assert(offsetof(struct otel_gpu_device_record, kind) == 48 &&
               offsetof(struct otel_gpu_device_record, api_id) == 52, "the BPF side mirrors this layout");

/* The hand-off, probed by the collector; a no-op otherwise. records[0..count) are valid only
 * during the call; count may be 0 when only `dropped` has news. `dropped` counts, since the
 * previous call, what did not arrive intact: records CUPTI lost (no buffer space), records
 * given up for lack of a timestamp, and records delivered without their launching call
 * (tid == 0, api_ns == 0, api_id == 0: its correlation entry was overwritten before the record came). */
void otel_gpu_device_records(const struct otel_gpu_device_record *records, uint32_t count,
                             uint64_t dropped);

#endif
