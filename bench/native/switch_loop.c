/* Two threads of one process ping-pong a byte over two pipes, both pinned to CPU 0: every
 * round trip is two context switches and two wake-ups, what the sched tracepoints of the
 * time split (bpf/sched_probes.c) see. Prints "rep <i> <ns per round trip>" (wall time on
 * the one CPU: the switches themselves are what is measured). With a libcudart path as its
 * third argument it loads it first: the collector then traces the process, and its
 * threads' time is kept (the traced case).
 *   switch_loop ITERATIONS REPS [libcudart] */
#define _GNU_SOURCE
#include <dlfcn.h>
#include <pthread.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <time.h>
#include <unistd.h>

static int ping[2], pong[2];
static long n;

static void pin(void)
{
    cpu_set_t one;
    CPU_ZERO(&one);
    CPU_SET(0, &one);
    pthread_setaffinity_np(pthread_self(), sizeof(one), &one);
}

static void *peer(void *unused)
{
    char c;
    (void)unused;
    pin();
    for (long i = 0; i < n; i++)
        if (read(ping[0], &c, 1) != 1 || write(pong[1], &c, 1) != 1)
            break;
    return 0;
}

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    n = atol(argv[1]);
    int reps = atoi(argv[2]);
    if (argc > 3 && !dlopen(argv[3], RTLD_NOW)) {
        fprintf(stderr, "cannot load %s\n", argv[3]);
        return 1;
    }
    pin();
    printf("ready\n");
    fflush(stdout);
    sleep(1); /* the collector finds a process that loaded libcudart within ~0.1 s */
    for (int r = 0; r < reps; r++) {
        if (pipe(ping) || pipe(pong))
            return 1;
        pthread_t t;
        pthread_create(&t, 0, peer, 0);
        struct timespec s, e;
        char c = 'x';
        clock_gettime(CLOCK_MONOTONIC, &s);
        for (long i = 0; i < n; i++)
            if (write(ping[1], &c, 1) != 1 || read(pong[0], &c, 1) != 1)
                break;
        clock_gettime(CLOCK_MONOTONIC, &e);
        pthread_join(t, 0);
        printf("rep %d %.1f\n", r, ((e.tv_sec - s.tv_sec) * 1e9 + (e.tv_nsec - s.tv_nsec)) / n);
        fflush(stdout);
        close(ping[0]); close(ping[1]); close(pong[0]); close(pong[1]);
    }
    return 0;
}
