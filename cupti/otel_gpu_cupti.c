/* libotel_gpu_cupti.so: the CUPTI injection library of otel-gpu's device-clock mode.
 *
 * A service loads it through CUDA_INJECTION64_PATH: the CUDA driver dlopens it and calls
 * InitializeInjection() at cuInit. It turns CUPTI activity records (kernels, memcpys, memsets)
 * into struct otel_gpu_device_record, on the CLOCK_MONOTONIC clock and tagged with the thread
 * and entry time of the API call that launched them, and passes them in batches to
 * otel_gpu_device_records(): a no-op that exists to be uprobed by the collector.
 *
 * It runs inside someone else's service, so it must never hurt it: any failure prints one line
 * and leaves CUDA alone, and nothing is traced (no API callbacks, no activity) unless the
 * collector's flag file exists. */
#define _GNU_SOURCE
#include <cupti.h>
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "device_record.h"
#include "record_versions.h"

#define NS_PER_S 1000000000ull
#define FLUSH_EVERY_NS (100 * 1000000ull) /* records reach the collector within ~0.1 s */
#define FLAG_EVERY_NS NS_PER_S
#define BUFFER_BYTES (1 << 20)            /* ~4800 kernel records between two flushes */
#define DEFAULT_FLAG "/run/otel-gpu/device-clock"

/* CUPTI is dlopened, not linked: one build serves CUPTI 12 and 13, and a missing libcupti
 * costs a line on stderr instead of a library the driver cannot load. */
#define CUPTI_FUNCTIONS(X) \
    X(cuptiSubscribe) X(cuptiEnableDomain) X(cuptiActivityRegisterCallbacks) \
    X(cuptiActivityEnable) X(cuptiActivityDisable) X(cuptiActivityFlushAll) \
    X(cuptiActivityGetNextRecord) X(cuptiActivityGetNumDroppedRecords) X(cuptiGetTimestamp) \
    X(cuptiGetResultString)
static struct {
#define POINTER(name) __typeof__(name) *name;
    CUPTI_FUNCTIONS(POINTER)
#undef POINTER
} cupti;

static const CUpti_CallbackDomain DOMAINS[] = {CUPTI_CB_DOMAIN_RUNTIME_API, CUPTI_CB_DOMAIN_DRIVER_API};
/* CONCURRENT_KERNEL, not KERNEL: KERNEL serializes every kernel launch of the process. */
static const CUpti_ActivityKind KINDS[] = {CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL,
                                           CUPTI_ACTIVITY_KIND_MEMCPY, CUPTI_ACTIVITY_KIND_MEMSET};

static atomic_uint_fast64_t dropped; /* since the last hand-off */

__attribute__((noinline, visibility("default")))
void otel_gpu_device_records(const struct otel_gpu_device_record *records, uint32_t count,
                             uint64_t dropped_since)
{
    /* The collector's uprobe reads the arguments; the asm keeps the call from being optimised
     * away, and makes the first instruction a nop, which x86 uprobes emulate (a bare `ret` they
     * single-step, ~3x the cost). The library calls this through its PLT, so a test may
     * interpose it. */
    (void)records, (void)count, (void)dropped_since;
    __asm__ volatile("nop" ::: "memory");
}

static int fail(const char *what, CUptiResult result)
{
    const char *text = NULL;
    if (!cupti.cuptiGetResultString || cupti.cuptiGetResultString(result, &text) != CUPTI_SUCCESS || !text)
        text = "unknown CUPTI error";
    fprintf(stderr, "otel-gpu-cupti: %s failed (%s); GPU device times are not traced\n", what, text);
    return 0;
}

static uint64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * NS_PER_S + (uint64_t)t.tv_nsec;
}

static uint32_t thread_id(void)
{
    /* Cached: a syscall on every CUDA API call would cost more than the rest of the callback.
     * No stale value survives a fork that matters: CUDA is unusable in a child forked after
     * cuInit, and before cuInit this library is not loaded. */
    static _Thread_local uint32_t tid;
    if (!tid)
        tid = (uint32_t)syscall(SYS_gettid);
    return tid;
}

/* correlationId -> launching thread and entry time. CUPTI hands over a kernel's record long
 * after its launch, on another thread, with only the correlationId to link the two. Ids are
 * sequential, so an entry lives until 65536 later API calls reuse its slot: far longer than the
 * ~0.1 s a record takes to arrive, unless a process makes over ~650k API calls a second. */
#define CALLS 65536
static struct call {
    atomic_uint lock; /* writers of one slot are 65536 ids apart: it never spins in practice */
    uint32_t correlation_id, tid;
    uint64_t api_ns;
    uint32_t api_id;   /* which API: the collector ties a record only to a call of that API */
    uint8_t api_domain;
} calls[CALLS];

static void lock(struct call *c)
{
    while (atomic_exchange_explicit(&c->lock, 1, memory_order_acquire))
        ;
}

static void unlock(struct call *c)
{
    atomic_store_explicit(&c->lock, 0, memory_order_release);
}

static void CUPTIAPI on_api_call(void *userdata, CUpti_CallbackDomain domain, CUpti_CallbackId cbid,
                                 const void *data)
{
    const CUpti_CallbackData *call = data;
    (void)userdata;
    if (call->callbackSite != CUPTI_API_ENTER)
        return;
    struct call *c = &calls[call->correlationId % CALLS];
    lock(c);
    /* The first entry of an id wins: a driver call made inside a runtime call may carry the
     * runtime call's id, and the span starts where the service called, not the runtime. */
    if (c->correlation_id != call->correlationId) {
        c->correlation_id = call->correlationId;
        c->tid = thread_id();
        c->api_ns = monotonic_ns();
        c->api_id = cbid;
        c->api_domain = (uint8_t)domain;
    }
    unlock(c);
}

static void recall(struct otel_gpu_device_record *out)
{
    struct call *c = &calls[out->correlation_id % CALLS];
    lock(c);
    if (c->correlation_id == out->correlation_id) {
        out->tid = c->tid;
        out->api_ns = c->api_ns;
        out->api_id = c->api_id;
        out->api_domain = c->api_domain;
    }
    unlock(c);
    if (!out->tid && out->correlation_id) /* id 0: CUPTI linked the record to no call */
        atomic_fetch_add(&dropped, 1);
}

/* CUPTI's clock is CLOCK_REALTIME on Linux by default, which can be stepped. The offset is
 * sampled when each buffer completes, between two monotonic reads; the narrowest of a few
 * brackets wins, so one preemption mid-sample cannot skew a whole buffer by its length. */
static uint64_t cupti_minus_monotonic(void)
{
    uint64_t best = UINT64_MAX, offset = 0;
    for (int i = 0; i < 3; i++) {
        uint64_t before = monotonic_ns(), cupti_ns = 0;
        cupti.cuptiGetTimestamp(&cupti_ns);
        uint64_t after = monotonic_ns();
        if (after - before < best) {
            best = after - before;
            offset = cupti_ns - (before + best / 2); /* modular: either clock may be ahead */
        }
    }
    return offset;
}

#define COPY_COMMON(out, r) \
    ((out)->start_ns = (r)->start, (out)->end_ns = (r)->end, (out)->correlation_id = (r)->correlationId, \
     (out)->stream_id = (r)->streamId, (out)->device_id = (r)->deviceId)

/* Returns whether `a` became a record: other kinds are skipped, and a record without both
 * timestamps (CUPTI_TIMESTAMP_UNKNOWN) is counted as dropped rather than passed on wrong. */
static bool convert(const CUpti_Activity *a, uint64_t offset, struct otel_gpu_device_record *out)
{
    memset(out, 0, sizeof *out);
    switch (a->kind) {
    case CUPTI_ACTIVITY_KIND_KERNEL:
    case CUPTI_ACTIVITY_KIND_CONCURRENT_KERNEL: {
        const kernel_record *k = (const void *)a;
        COPY_COMMON(out, k);
        out->kind = OTEL_GPU_DEVICE_KERNEL;
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMCPY: {
        const memcpy_record *m = (const void *)a;
        COPY_COMMON(out, m);
        out->kind = OTEL_GPU_DEVICE_MEMCPY;
        out->bytes = m->bytes;
        out->copy_kind = m->copyKind;
        break;
    }
    case CUPTI_ACTIVITY_KIND_MEMSET: {
        const memset_record *m = (const void *)a;
        COPY_COMMON(out, m);
        out->kind = OTEL_GPU_DEVICE_MEMSET;
        out->bytes = m->bytes;
        break;
    }
    default:
        return false;
    }
    if (!out->start_ns || !out->end_ns) {
        atomic_fetch_add(&dropped, 1);
        return false;
    }
    out->start_ns -= offset;
    out->end_ns -= offset;
    recall(out);
    return true;
}

static void hand_over(const struct otel_gpu_device_record *records, uint32_t count)
{
    otel_gpu_device_records(records, count, atomic_exchange(&dropped, 0));
}

static void CUPTIAPI buffer_requested(uint8_t **buffer, size_t *size, size_t *max_records)
{
    /* NULL declines: CUPTI then drops records and counts them (cuptiActivityGetNumDroppedRecords). */
    *buffer = malloc(BUFFER_BYTES); /* CUPTI needs 8-byte alignment; malloc gives 16 */
    *size = *buffer ? BUFFER_BYTES : 0;
    *max_records = 0;
}

static void CUPTIAPI buffer_completed(CUcontext context, uint32_t stream, uint8_t *buffer, size_t size,
                                      size_t valid)
{
    struct otel_gpu_device_record batch[OTEL_GPU_RECORDS_PER_CALL];
    uint32_t n = 0;
    size_t lost = 0;
    (void)size;
    if (cupti.cuptiActivityGetNumDroppedRecords(context, stream, &lost) == CUPTI_SUCCESS)
        atomic_fetch_add(&dropped, lost);
    if (buffer) {
        uint64_t offset = cupti_minus_monotonic();
        CUpti_Activity *a = NULL;
        while (cupti.cuptiActivityGetNextRecord(buffer, valid, &a) == CUPTI_SUCCESS)
            if (convert(a, offset, &batch[n]) && ++n == OTEL_GPU_RECORDS_PER_CALL) {
                hand_over(batch, n);
                n = 0;
            }
    }
    if (n || atomic_load(&dropped))
        hand_over(batch, n);
    free(buffer);
}

/* Tracing on and off, driven by the flag file. Only the watcher thread (and, before it starts
 * and after it stops, InitializeInjection and the exit handler) touches this. */
static bool tracing;
static const char *flag_path;
static CUpti_SubscriberHandle subscriber;

/* API callbacks go on before activity and off after it, so no record arrives whose launching
 * call went unseen. Returns the first failure, having undone everything on failure. */
static CUptiResult set_tracing(bool on)
{
    CUptiResult result = CUPTI_SUCCESS;
    const char *what = "";
    if (on == tracing)
        return CUPTI_SUCCESS;
    for (size_t i = 0; on && result == CUPTI_SUCCESS && i < sizeof DOMAINS / sizeof *DOMAINS; i++)
        if ((result = cupti.cuptiEnableDomain(1, subscriber, DOMAINS[i])) != CUPTI_SUCCESS)
            what = "cuptiEnableDomain";
    for (size_t i = 0; on && result == CUPTI_SUCCESS && i < sizeof KINDS / sizeof *KINDS; i++)
        if ((result = cupti.cuptiActivityEnable(KINDS[i])) != CUPTI_SUCCESS)
            what = "cuptiActivityEnable";
    if (on && result == CUPTI_SUCCESS) {
        tracing = true;
        return CUPTI_SUCCESS;
    }
    /* Off, or undoing a partial on. Records still buffered arrive with a later flush. */
    for (size_t i = 0; i < sizeof KINDS / sizeof *KINDS; i++)
        cupti.cuptiActivityDisable(KINDS[i]);
    cupti.cuptiActivityFlushAll(0);
    for (size_t i = 0; i < sizeof DOMAINS / sizeof *DOMAINS; i++)
        cupti.cuptiEnableDomain(0, subscriber, DOMAINS[i]);
    tracing = false;
    if (result != CUPTI_SUCCESS) {
        static bool told; /* once: the watcher retries every second */
        if (!told)
            fail(what, result);
        told = true;
    }
    return result;
}

static pthread_t watcher;
static pid_t watcher_pid; /* a child forked later inherits the exit handler, not the thread */
static pthread_mutex_t watch_lock = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t watch_wake;
static bool stopping;

static void *watch(void *unused)
{
    uint64_t next_check = monotonic_ns() + FLAG_EVERY_NS; /* InitializeInjection checked once */
    (void)unused;
    pthread_mutex_lock(&watch_lock);
    while (!stopping) {
        pthread_mutex_unlock(&watch_lock);
        uint64_t now = monotonic_ns();
        if (now >= next_check) {
            set_tracing(access(flag_path, F_OK) == 0);
            next_check = now + FLAG_EVERY_NS;
        }
        if (tracing)
            cupti.cuptiActivityFlushAll(0); /* completed records only; buffers need not be full */
        /* Without a collector the thread wakes once a second, for one access(2). */
        uint64_t wake = tracing ? now + FLUSH_EVERY_NS : next_check;
        struct timespec at = {.tv_sec = (time_t)(wake / NS_PER_S), .tv_nsec = (long)(wake % NS_PER_S)};
        pthread_mutex_lock(&watch_lock);
        if (!stopping)
            pthread_cond_timedwait(&watch_wake, &watch_lock, &at);
    }
    pthread_mutex_unlock(&watch_lock);
    return NULL;
}

/* At exit the watcher is stopped and joined rather than left to die mid-call into CUPTI while
 * CUDA tears down; then a forced flush hands over the last records, incomplete ones included. */
static void stop_watching(void)
{
    if (getpid() != watcher_pid)
        return; /* nothing to join, and CUPTI is not to be used in a forked child */
    pthread_mutex_lock(&watch_lock);
    stopping = true;
    pthread_cond_signal(&watch_wake);
    pthread_mutex_unlock(&watch_lock);
    pthread_join(watcher, NULL);
    if (tracing)
        cupti.cuptiActivityFlushAll(CUPTI_ACTIVITY_FLAG_FLUSH_FORCED);
}

static bool load_cupti(void)
{
    static const char *const names[] = {"libcupti.so.13", "libcupti.so.12", "libcupti.so"};
    const char *path = getenv("OTEL_GPU_CUPTI_LIB");
    void *lib = NULL;
    if (path && *path)
        lib = dlopen(path, RTLD_NOW | RTLD_LOCAL);
    else
        for (size_t i = 0; !lib && i < sizeof names / sizeof *names; i++)
            lib = dlopen(path = names[i], RTLD_NOW | RTLD_LOCAL);
    if (!lib) {
        fprintf(stderr, "otel-gpu-cupti: cannot load libcupti (%s; set OTEL_GPU_CUPTI_LIB); "
                        "GPU device times are not traced\n", dlerror());
        return false;
    }
#define LOAD(name) \
    if (!(cupti.name = (__typeof__(name) *)dlsym(lib, #name))) { \
        fprintf(stderr, "otel-gpu-cupti: %s lacks %s; GPU device times are not traced\n", path, #name); \
        return false; \
    }
    CUPTI_FUNCTIONS(LOAD)
#undef LOAD
    return true;
}

int InitializeInjection(void)
{
    CUptiResult r;
    pthread_condattr_t attr;
    if (!load_cupti())
        return 0;
    /* Subscribing fails when another tool (a profiler) already holds CUPTI's one subscriber. */
    if ((r = cupti.cuptiSubscribe(&subscriber, on_api_call, NULL)) != CUPTI_SUCCESS)
        return fail("cuptiSubscribe", r);
    if ((r = cupti.cuptiActivityRegisterCallbacks(buffer_requested, buffer_completed)) != CUPTI_SUCCESS)
        return fail("cuptiActivityRegisterCallbacks", r);
    flag_path = getenv("OTEL_GPU_DEVICE_CLOCK_FLAG");
    if (!flag_path || !*flag_path)
        flag_path = DEFAULT_FLAG;
    pthread_condattr_init(&attr);
    pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
    pthread_cond_init(&watch_wake, &attr);
    pthread_condattr_destroy(&attr);
    /* Checked now, not on the watcher's first tick: a collector already running sees the first
     * launches too. */
    if (access(flag_path, F_OK) == 0 && set_tracing(true) != CUPTI_SUCCESS)
        return 0;
    watcher_pid = getpid();
    if (pthread_create(&watcher, NULL, watch, NULL) != 0) {
        set_tracing(false);
        fprintf(stderr, "otel-gpu-cupti: cannot start a thread; GPU device times are not traced\n");
        return 0;
    }
    atexit(stop_watching);
    return 1;
}
