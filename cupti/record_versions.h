/* The CUPTI activity record structs the library reads, and the fake CUPTI of its tests
 * writes: the newest each header set declares (CUPTI 13: Kernel10; 12.x: Kernel9). Only start,
 * end, correlationId, streamId, deviceId, bytes and copyKind are read, and those sit at the same
 * offsets in every struct version still declared (asserted below), so a build against either
 * header set reads the records of either CUPTI. */
#ifndef OTEL_GPU_RECORD_VERSIONS_H
#define OTEL_GPU_RECORD_VERSIONS_H

#include <cupti.h>
#include <stddef.h>

#if CUPTI_API_VERSION >= 130000 /* 13.x numbers its API xxyyzz; 12.x used 18..28 */
typedef CUpti_ActivityKernel10 kernel_record;
#else
typedef CUpti_ActivityKernel9 kernel_record;
#endif
typedef CUpti_ActivityMemcpy6 memcpy_record;
typedef CUpti_ActivityMemset4 memset_record;

#define SAME_OFFSETS(T, OLD) \
    _Static_assert(offsetof(T, start) == offsetof(OLD, start) && \
                   offsetof(T, end) == offsetof(OLD, end) && \
                   offsetof(T, correlationId) == offsetof(OLD, correlationId) && \
                   offsetof(T, streamId) == offsetof(OLD, streamId) && \
                   offsetof(T, deviceId) == offsetof(OLD, deviceId), #T " moved a field it shares with " #OLD)
SAME_OFFSETS(kernel_record, CUpti_ActivityKernel4);
SAME_OFFSETS(memcpy_record, CUpti_ActivityMemcpy);
SAME_OFFSETS(memset_record, CUpti_ActivityMemset);

#endif
