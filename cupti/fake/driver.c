/* Test driver: a stand-in CUDA service for libotel_gpu_cupti.so over the fake CUPTI
 * (fake_cupti.c), used by tests/unit/cupti/test_injection_library.py.
 *
 *   driver LIBRARY trace|off|toggle|init    (OTEL_GPU_CUPTI_LIB: the fake; init: initialize, exit)
 *
 * It defines otel_gpu_device_records itself and is linked -rdynamic, so the library's PLT call
 * lands here: it sees every hand-off the collector's uprobe would, and prints each call and
 * record as a line. Two threads make API calls, each followed by its kernel, memcpy or memset,
 * with values that encode phase, thread and call (see work()), so the test can tell exactly
 * which record must carry which thread. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/syscall.h>
#include <time.h>
#include <unistd.h>

#include "../device_record.h"

#define THREADS 2
#define CALLS 50              /* per thread, kind and phase */
#define LEAD_NS 200000        /* a device starts this long after its API call returned */
#define ORPHAN 999999         /* a kernel record without an API call */
#define UNTIMED 999998        /* a kernel record without timestamps (CUPTI_TIMESTAMP_UNKNOWN) */
#define TIMEOUT_NS 3000000000ull
/* The API each kind's call is made as: CUPTI_CB_DOMAIN_RUNTIME_API (2) and the callback ids of
 * cudaLaunchKernel, cudaMemcpyAsync and cudaMemsetAsync (cupti_runtime_cbid.h). */
#define RUNTIME_DOMAIN 2
static const uint32_t API_IDS[3] = {211, 41, 51};

static struct {
    void (*api_call)(uint32_t, uint32_t, uint32_t);
    void (*kernel)(uint32_t, uint64_t, uint64_t, uint32_t, uint32_t);
    void (*memcpy)(uint32_t, uint64_t, uint64_t, uint64_t, uint8_t, uint32_t, uint32_t);
    void (*memset)(uint32_t, uint64_t, uint64_t, uint64_t, uint32_t, uint32_t);
    int (*tracing)(void);
    uint64_t (*callbacks)(void);
    int (*timestamp)(uint64_t *); /* cuptiGetTimestamp: the fake's clock */
} fake;

static pthread_mutex_t out = PTHREAD_MUTEX_INITIALIZER;
static atomic_uint arrived;

void otel_gpu_device_records(const struct otel_gpu_device_record *r, uint32_t count, uint64_t dropped)
{
    pthread_mutex_lock(&out);
    printf("call count=%u dropped=%llu\n", count, (unsigned long long)dropped);
    for (uint32_t i = 0; i < count; i++, r++)
        printf("rec kind=%u corr=%u tid=%u start=%llu end=%llu api=%llu bytes=%llu copy=%u stream=%u dev=%u "
               "domain=%u cbid=%u\n",
               r->kind, r->correlation_id, r->tid, (unsigned long long)r->start_ns, (unsigned long long)r->end_ns,
               (unsigned long long)r->api_ns, (unsigned long long)r->bytes, r->copy_kind, r->stream_id,
               r->device_id, r->api_domain, r->api_id);
    pthread_mutex_unlock(&out);
    atomic_fetch_add(&arrived, count);
}

static uint64_t monotonic_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_MONOTONIC, &t);
    return (uint64_t)t.tv_sec * 1000000000ull + (uint64_t)t.tv_nsec;
}

static void sleep_ms(long ms)
{
    struct timespec t = {.tv_sec = ms / 1000, .tv_nsec = ms % 1000 * 1000000};
    nanosleep(&t, NULL);
}

/* Polls `done` every 5 ms for at most TIMEOUT_NS; every wait is bounded. */
static int wait_until(int (*done)(int), int arg, const char *what)
{
    uint64_t start = monotonic_ns();
    while (!done(arg)) {
        if (monotonic_ns() - start > TIMEOUT_NS) {
            printf("timeout %s\n", what);
            return 0;
        }
        sleep_ms(5);
    }
    printf("waited %s ms=%llu\n", what, (unsigned long long)((monotonic_ns() - start) / 1000000));
    return 1;
}

static int arrived_at_least(int n) { return atomic_load(&arrived) >= (unsigned)n; }
static int tracing_is(int state) { return fake.tracing() == state; }

static pthread_barrier_t together;

/* Thread t (0, 1) of phase p makes calls with correlation id p*100000 + (t+1)*10000 + 3*i + k,
 * k: 0 kernel, 1 memcpy, 2 memset; on stream 7+t, device t; for i-th calls, a device time of
 * 1000+i ns, memcpy bytes (t+1)*1000000+i with copy kind t+1, memset bytes (t+1)*2000000+i. */
struct work { int phase, thread; };

static void *work(void *arg)
{
    const struct work *w = arg;
    uint32_t t = (uint32_t)w->thread;
    pthread_mutex_lock(&out);
    printf("thread phase=%d t=%u tid=%ld\n", w->phase, t, (long)syscall(SYS_gettid));
    pthread_mutex_unlock(&out);
    pthread_barrier_wait(&together);
    for (uint32_t i = 0; i < CALLS; i++)
        for (uint32_t k = 0; k < 3; k++) {
            uint32_t corr = (uint32_t)w->phase * 100000 + (t + 1) * 10000 + 3 * i + k;
            uint64_t start;
            fake.api_call(corr, RUNTIME_DOMAIN, API_IDS[k]);
            fake.timestamp(&start);
            start += LEAD_NS;
            if (k == 0)
                fake.kernel(corr, start, start + 1000 + i, 7 + t, t);
            else if (k == 1)
                fake.memcpy(corr, start, start + 1000 + i, (t + 1) * 1000000 + i, (uint8_t)(t + 1), 7 + t, t);
            else
                fake.memset(corr, start, start + 1000 + i, (t + 1) * 2000000 + i, 7 + t, t);
        }
    return NULL;
}

static void run_phase(int phase)
{
    pthread_t threads[THREADS];
    struct work works[THREADS];
    pthread_barrier_init(&together, NULL, THREADS);
    for (int t = 0; t < THREADS; t++) {
        works[t] = (struct work){phase, t};
        pthread_create(&threads[t], NULL, work, &works[t]);
    }
    for (int t = 0; t < THREADS; t++)
        pthread_join(threads[t], NULL);
    pthread_barrier_destroy(&together);
}

static void set_flag(int on)
{
    const char *path = getenv("OTEL_GPU_DEVICE_CLOCK_FLAG");
    FILE *flag;
    if (on && (flag = fopen(path, "w")))
        fclose(flag);
    else if (!on)
        unlink(path);
}

int main(int argc, char **argv)
{
    const int per_phase = THREADS * CALLS * 3;
    if (argc != 3) {
        fprintf(stderr, "usage: driver LIBRARY trace|off|toggle|init\n");
        return 2;
    }
    setvbuf(stdout, NULL, _IOLBF, 0);
    void *library = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    int (*initialize)(void) = library ? (int (*)(void))dlsym(library, "InitializeInjection") : NULL;
    if (!initialize) {
        fprintf(stderr, "driver: %s\n", dlerror());
        return 2;
    }
    uint64_t t0 = monotonic_ns();
    int initialized = initialize();
    printf("init=%d\n", initialized);
    if (!initialized || !strcmp(argv[2], "init"))
        return 0; /* as a service would: it runs on, without device times */

    void *cupti = dlopen(getenv("OTEL_GPU_CUPTI_LIB"), RTLD_NOW | RTLD_NOLOAD); /* the library's copy */
    if (!cupti) {
        fprintf(stderr, "driver: the library did not load the fake CUPTI\n");
        return 2;
    }
    *(void **)&fake.api_call = dlsym(cupti, "fake_cupti_api_call");
    *(void **)&fake.kernel = dlsym(cupti, "fake_cupti_kernel");
    *(void **)&fake.memcpy = dlsym(cupti, "fake_cupti_memcpy");
    *(void **)&fake.memset = dlsym(cupti, "fake_cupti_memset");
    *(void **)&fake.tracing = dlsym(cupti, "fake_cupti_tracing");
    *(void **)&fake.callbacks = dlsym(cupti, "fake_cupti_callbacks");
    *(void **)&fake.timestamp = dlsym(cupti, "cuptiGetTimestamp");

    if (!strcmp(argv[2], "trace")) {
        run_phase(1);
        uint64_t start;
        fake.timestamp(&start);
        fake.kernel(ORPHAN, start, start + 500, 9, 0);
        fake.api_call(UNTIMED, RUNTIME_DOMAIN, API_IDS[0]);
        fake.kernel(UNTIMED, 0, 0, 9, 0);
        wait_until(arrived_at_least, per_phase + 1, "records");
    } else if (!strcmp(argv[2], "off")) {
        run_phase(1);
        sleep_ms(300); /* three flush periods, were tracing on */
    } else { /* toggle: off, on, off */
        run_phase(1);
        set_flag(1);
        if (wait_until(tracing_is, 1, "on")) {
            run_phase(2);
            wait_until(arrived_at_least, per_phase, "records");
        }
        set_flag(0);
        if (wait_until(tracing_is, 0, "off"))
            run_phase(3);
        sleep_ms(300);
    }
    printf("clock t0=%llu t1=%llu\n", (unsigned long long)t0, (unsigned long long)monotonic_ns());
    printf("callbacks=%llu arrived=%u\n", (unsigned long long)fake.callbacks(), atomic_load(&arrived));
    return 0; /* exit runs the library's exit handler: it joins its thread */
}
