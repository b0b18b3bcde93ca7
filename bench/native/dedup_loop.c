/* Runtime launches that reach the driver, and a library's own driver launches, through
 * the stub libraries of the bpf tests (no driver exists without a GPU; the probes' cost
 * is paid at each call's entry, before the library runs):
 *
 *   dedup_loop LIBCUDART LIBRARY MODE [--iters N] [--reps R]
 *
 * MODE r: cudaLaunchKernel of the stub libcudart, which calls the stub libcuda's
 * cuLaunchKernel (both probes fire; the driver probe drops it as a pass-through);
 * MODE l: stub_library_launch, a cuLaunchKernel from another library (counted).
 * Prints "ready <pid>", waits for a line on stdin, then runs R timed reps of N calls on
 * one thread ("rep <i> <wall ns per call> <thread CPU ns per call>"). Bounded loops. */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);
typedef int (*library_fn)(void *, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned, unsigned);

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

int main(int argc, char **argv)
{
    long iters = 1000000, reps = 5;
    if (argc < 4)
        return 2;
    for (int i = 4; i + 1 < argc; i += 2) {
        if (!strcmp(argv[i], "--iters"))
            iters = atol(argv[i + 1]);
        else if (!strcmp(argv[i], "--reps"))
            reps = atol(argv[i + 1]);
    }
    void *rt = dlopen(argv[1], RTLD_NOW), *lib = dlopen(argv[2], RTLD_NOW);
    if (!rt || !lib) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    launch_fn launch = (launch_fn)dlsym(rt, "cudaLaunchKernel");
    library_fn own = (library_fn)dlsym(lib, "stub_library_launch");
    int runtime = argv[3][0] == 'r';
    if (!launch || !own)
        return 1;
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    if (!fgets(line, sizeof(line), stdin))
        return 1;
    dim3 grid = {6, 2, 1}, block = {64, 2, 1};
    for (long r = 0; r < reps; r++) {
        double w0 = clock_s(CLOCK_MONOTONIC), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        for (long i = 0; i < iters; i++) {
            if (runtime)
                launch((void *)0x1000, grid, block, NULL, 128, NULL);
            else
                own((void *)0x1000, 6, 2, 1, 64, 2, 1, 128);
        }
        double w1 = clock_s(CLOCK_MONOTONIC), c1 = clock_s(CLOCK_THREAD_CPUTIME_ID);
        printf("rep %ld %.1f %.1f\n", r, (w1 - w0) * 1e9 / iters, (c1 - c0) * 1e9 / iters);
        fflush(stdout);
    }
    return 0;
}
