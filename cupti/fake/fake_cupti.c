/* libfake_cupti.so: a FAKE libcupti, for tests only.
 *
 * No GPU exists where otel-gpu's unit tests run, so the real CUPTI never calls back or produces
 * an activity record there. This fake speaks the part of CUPTI's C API that
 * libotel_gpu_cupti.so dlsyms, compiled against the same CUPTI headers (so the compiler holds
 * its signatures and record structs to theirs), and lets a test act as CUDA would:
 *
 *   fake_cupti_api_call()  an API call (domain, callback id) on the calling thread: ENTER and EXIT callbacks
 *   fake_cupti_kernel() / _memcpy() / _memset()  an activity record, produced only while its
 *                          kind is enabled, into a buffer from the bufferRequested callback;
 *                          cuptiActivityFlushAll() hands filled buffers to bufferCompleted
 *   fake_cupti_tracing()   1 when all that the library turns on is on, 0 when all is off
 *
 * Its clock (cuptiGetTimestamp, and the timestamps a test puts in records) is CLOCK_MONOTONIC
 * plus FAKE_CUPTI_CLOCK_OFFSET_NS, so the library's clock conversion is exercised. */
#define _GNU_SOURCE
#include <cupti.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <string.h>
#include <time.h>

#define FAKE_CUPTI_CLOCK_OFFSET_NS 1000000000000ull

#include "../record_versions.h" /* the same record structs as the library reads */

static struct CUpti_Subscriber_st *subscriber;
static char the_subscriber;
static CUpti_CallbackFunc callback;
static void *callback_data;
static atomic_uint domains;          /* bit per CUpti_CallbackDomain */
static atomic_uint_fast64_t kinds;   /* bit per CUpti_ActivityKind */
static atomic_uint_fast64_t callbacks_made;
static CUpti_BuffersCallbackRequestFunc buffer_requested;
static CUpti_BuffersCallbackCompleteFunc buffer_completed;

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER; /* the buffer being filled */
static uint8_t *buffer;
static size_t buffer_size, buffer_used;
static atomic_size_t dropped;

CUptiResult CUPTIAPI cuptiSubscribe(CUpti_SubscriberHandle *handle, CUpti_CallbackFunc func, void *userdata)
{
    if (subscriber)
        return CUPTI_ERROR_MULTIPLE_SUBSCRIBERS_NOT_SUPPORTED;
    subscriber = (struct CUpti_Subscriber_st *)&the_subscriber;
    callback = func;
    callback_data = userdata;
    *handle = subscriber;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiEnableDomain(uint32_t enable, CUpti_SubscriberHandle handle, CUpti_CallbackDomain domain)
{
    if (!handle || handle != subscriber || domain <= 0 || domain >= 32)
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (enable)
        atomic_fetch_or(&domains, 1u << domain);
    else
        atomic_fetch_and(&domains, ~(1u << domain));
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityRegisterCallbacks(CUpti_BuffersCallbackRequestFunc requested,
                                                    CUpti_BuffersCallbackCompleteFunc completed)
{
    if (!requested || !completed)
        return CUPTI_ERROR_INVALID_PARAMETER;
    buffer_requested = requested;
    buffer_completed = completed;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityEnable(CUpti_ActivityKind kind)
{
    if (kind <= 0 || kind >= 64)
        return CUPTI_ERROR_INVALID_KIND;
    atomic_fetch_or(&kinds, 1ull << kind);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityDisable(CUpti_ActivityKind kind)
{
    if (kind <= 0 || kind >= 64)
        return CUPTI_ERROR_INVALID_KIND;
    atomic_fetch_and(&kinds, ~(1ull << kind));
    return CUPTI_SUCCESS;
}

static size_t record_size(const CUpti_Activity *record)
{
    switch (record->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: return sizeof(kernel_record);
    case CUPTI_ACTIVITY_KIND_MEMCPY: return sizeof(memcpy_record);
    case CUPTI_ACTIVITY_KIND_MEMSET: return sizeof(memset_record);
    default: return 0;
    }
}

/* Takes the buffer being filled, if it holds records, to hand to bufferCompleted outside the lock
 * (the library's callback calls back into this fake). */
static uint8_t *take_buffer(size_t *size, size_t *used)
{
    uint8_t *full = NULL;
    if (buffer && buffer_used) {
        full = buffer, *size = buffer_size, *used = buffer_used;
        buffer = NULL, buffer_size = buffer_used = 0;
    }
    return full;
}

CUptiResult CUPTIAPI cuptiActivityFlushAll(uint32_t flag)
{
    size_t size = 0, used = 0;
    (void)flag; /* every fake record is complete: a forced flush returns the same */
    if (!buffer_completed)
        return CUPTI_ERROR_INVALID_OPERATION;
    pthread_mutex_lock(&lock);
    uint8_t *full = take_buffer(&size, &used);
    pthread_mutex_unlock(&lock);
    if (full)
        buffer_completed(NULL, 0, full, size, used);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiActivityGetNextRecord(uint8_t *start, size_t valid, CUpti_Activity **record)
{
    uint8_t *next = start;
    if (!start || !record)
        return CUPTI_ERROR_INVALID_PARAMETER;
    if (*record)
        next = (uint8_t *)*record + ((record_size(*record) + 7) & ~(size_t)7);
    if (next >= start + valid)
        return CUPTI_ERROR_MAX_LIMIT_REACHED;
    *record = (CUpti_Activity *)next;
    return record_size(*record) ? CUPTI_SUCCESS : CUPTI_ERROR_INVALID_KIND;
}

CUptiResult CUPTIAPI cuptiActivityGetNumDroppedRecords(CUcontext context, uint32_t stream, size_t *count)
{
    (void)context, (void)stream;
    if (!count)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *count = atomic_exchange(&dropped, 0);
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetTimestamp(uint64_t *timestamp)
{
    struct timespec t;
    if (!timestamp)
        return CUPTI_ERROR_INVALID_PARAMETER;
    clock_gettime(CLOCK_MONOTONIC, &t);
    *timestamp = (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec + FAKE_CUPTI_CLOCK_OFFSET_NS;
    return CUPTI_SUCCESS;
}

CUptiResult CUPTIAPI cuptiGetResultString(CUptiResult result, const char **text)
{
    if (!text)
        return CUPTI_ERROR_INVALID_PARAMETER;
    *text = result == CUPTI_SUCCESS ? "CUPTI_SUCCESS" : "fake CUPTI error";
    return CUPTI_SUCCESS;
}

/* ---- test hooks ---- */

void fake_cupti_api_call(uint32_t correlation_id, uint32_t domain, uint32_t cbid)
{
    CUpti_CallbackData data;
    if (!callback || !(atomic_load(&domains) & (1u << domain)))
        return;
    memset(&data, 0, sizeof data);
    data.functionName = "fake";
    data.correlationId = correlation_id;
    for (int site = CUPTI_API_ENTER; site <= CUPTI_API_EXIT; site++) {
        data.callbackSite = (CUpti_ApiCallbackSite)site;
        callback(callback_data, (CUpti_CallbackDomain)domain, (CUpti_CallbackId)cbid, &data);
        atomic_fetch_add(&callbacks_made, 1);
    }
}

static bool enabled(CUpti_ActivityKind kind)
{
    return atomic_load(&kinds) & (1ull << kind);
}

/* Copies `record` into the buffer being filled, asking the library for one when there is none
 * and completing the current one when it is full; a declined buffer drops the record, counted
 * as CUPTI counts it. */
static void produce(const void *record, size_t size)
{
    size_t full_size = 0, full_used = 0;
    uint8_t *full = NULL;
    pthread_mutex_lock(&lock);
    if (buffer && buffer_used + size > buffer_size)
        full = take_buffer(&full_size, &full_used);
    if (!buffer && buffer_requested) {
        size_t max_records = 0;
        buffer_requested(&buffer, &buffer_size, &max_records);
        buffer_used = 0;
    }
    if (buffer && buffer_used + size <= buffer_size) {
        memcpy(buffer + buffer_used, record, size);
        buffer_used += (size + 7) & ~(size_t)7;
    } else {
        atomic_fetch_add(&dropped, 1);
    }
    pthread_mutex_unlock(&lock);
    if (full)
        buffer_completed(NULL, 0, full, full_size, full_used);
}

/* The fields every record the fake makes shares, from the maker's arguments of those names. */
#define SET_COMMON(r) \
    ((r).start = start, (r).end = end, (r).correlationId = correlation_id, (r).streamId = stream, \
     (r).deviceId = device)
/* A memcpy or memset record zeroed, of kind `activity`, with the shared fields set: false
 * (nothing made) while the library keeps that kind off. */
#define START_RECORD(r, activity) \
    (enabled(activity) && (memset(&(r), 0, sizeof(r)), (r).kind = (activity), SET_COMMON(r), true))

void fake_cupti_kernel(uint32_t correlation_id, uint64_t start, uint64_t end, uint32_t stream, uint32_t device)
{
    kernel_record k;
    memset(&k, 0, sizeof k);
    k.kind = enabled(CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL) ? CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL
             : enabled(CUPTI_ACTIVITY_KIND_KERNEL)          ? CUPTI_ACTIVITY_KIND_KERNEL
                                                            : CUPTI_ACTIVITY_KIND_INVALID;
    if (k.kind == CUPTI_ACTIVITY_KIND_INVALID)
        return;
    SET_COMMON(k);
    k.name = "fake_kernel";
    produce(&k, sizeof k);
}

void fake_cupti_memcpy(uint32_t correlation_id, uint64_t start, uint64_t end, uint64_t bytes, uint8_t copy_kind,
                       uint32_t stream, uint32_t device)
{
    memcpy_record m;
    if (!START_RECORD(m, CUPTI_ACTIVITY_KIND_MEMCPY))
        return;
    m.bytes = bytes, m.copyKind = copy_kind;
    produce(&m, sizeof m);
}

void fake_cupti_memset(uint32_t correlation_id, uint64_t start, uint64_t end, uint64_t bytes, uint32_t stream,
                       uint32_t device)
{
    memset_record m;
    if (!START_RECORD(m, CUPTI_ACTIVITY_KIND_MEMSET))
        return;
    m.bytes = bytes;
    produce(&m, sizeof m);
}

int fake_cupti_tracing(void)
{
    const uint64_t all_kinds = 1ull << CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL | 1ull << CUPTI_ACTIVITY_KIND_MEMCPY |
                               1ull << CUPTI_ACTIVITY_KIND_MEMSET;
    const unsigned all_domains = 1u << CUPTI_CB_DOMAIN_RUNTIME_API | 1u << CUPTI_CB_DOMAIN_DRIVER_API;
    uint64_t k = atomic_load(&kinds);
    unsigned d = atomic_load(&domains);
    return k == all_kinds && d == all_domains ? 1 : !k && !d ? 0 : -1;
}

/* How many callbacks fake_cupti_api_call made: none while the library keeps tracing off. */
uint64_t fake_cupti_callbacks(void)
{
    return atomic_load(&callbacks_made);
}
