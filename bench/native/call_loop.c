/* Calls `symbol` of the library `path` N times on one thread and prints the thread CPU
 * per call (ns): bench/items/probe_prologue.py times one probed function this way. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>

int main(int argc, char **argv) {
    if (argc != 4) {
        fprintf(stderr, "usage: call_loop LIBRARY SYMBOL CALLS\n");
        return 2;
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    long (*fn)(long) = lib ? (long (*)(long))dlsym(lib, argv[2]) : NULL;
    if (!fn) {
        fprintf(stderr, "%s\n", dlerror());
        return 1;
    }
    long n = atol(argv[3]);
    volatile long sink = 0;
    struct timespec a, b;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &a);
    for (long i = 0; i < n; i++)
        sink += fn(i);
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &b);
    printf("%.1f\n", ((b.tv_sec - a.tv_sec) * 1e9 + (b.tv_nsec - a.tv_nsec)) / n);
    return 0;
}
