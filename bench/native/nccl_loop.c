/* A tight ncclAllReduce loop through a libnccl.so.2 (dlopen by path: the test stub, as
 * no real communicator exists without a GPU; the probe's cost is the same, it is paid at
 * the call's entry before the library runs).
 *
 *   nccl_loop LIBNCCL [--iters N] [--reps R]
 *
 * Creates one communicator (ncclCommInitRank: 4 ranks, rank 1), prints "ready <pid>",
 * waits for a line on stdin, then runs R timed reps of N calls on one thread
 * ("rep <i> <wall ns per call> <thread CPU ns per call>"). Every loop is bounded. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { char internal[128]; } ncclUniqueId;
typedef int (*init_fn)(void **, int, ncclUniqueId, int);
typedef int (*all_reduce_fn)(const void *, void *, size_t, int, int, void *, void *);

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long iters = 1000000, reps = 5;
    if (argc < 2)
        return 2;
    for (int i = 2; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--iters"))
            iters = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atol(argv[i + 1]);
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    if (!lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    init_fn init = (init_fn)dlsym(lib, "ncclCommInitRank");
    all_reduce_fn all_reduce = (all_reduce_fn)dlsym(lib, "ncclAllReduce");
    ncclUniqueId id = {{0}};
    void *comm = NULL;
    if (!init || !all_reduce || init(&comm, 4, id, 1) != 0)
        return 1;
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    for (long r = 0; r < reps; r++) {
        double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (long i = 0; i < iters; i++)
            all_reduce(NULL, NULL, 1024, 7, 0, comm, NULL);
        double w1 = clock_s(CLOCK_MONOTONIC), c1 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        printf("rep %ld %.1f %.1f\n", r, (w1 - w0) * 1e9 / iters, (c1 - c0) * 1e9 / iters);
        fflush(stdout);
    }
    return 0;
}
