/* A tight cudaLaunchKernel loop through a libcudart (dlopen by path).
 *
 *   launch_loop LIBCUDART [--iters N] [--reps R] [--threads T --rate PER_S --seconds S]
 *               [--http [--requests K]]
 *
 * Prints "ready <pid>" and waits for a line on stdin, so the caller can first have
 * a tracer attach. With --http it listens on 127.0.0.1 (prints "port <p>" first),
 * and after the go line accepts one connection and reads one request from it, so
 * the collector sees an open HTTP request for the whole loop; the response is
 * written after the loop. With --requests K the connection is kept alive and every rep
 * serves K requests of N launches each (request, launches, response), timing only the
 * launches: what a launch costs inside requests of that size. Without --rate: R timed
 * reps of N launches on one thread ("rep <i> <wall ns per launch> <thread CPU ns per
 * launch>"; the thread's CPU time includes the uprobe and BPF work
 * done on its behalf, not time preempted). With --rate: T threads paced to PER_S
 * launches/s in total for S seconds ("launched <n> <seconds>"). Every loop is bounded. */
#define _GNU_SOURCE
#include <arpa/inet.h>
#include <dlfcn.h>
#include <netinet/in.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);

static launch_fn launch;
static long per_thread_rate, seconds;
static long launched_total;
static pthread_mutex_t total_lock = PTHREAD_MUTEX_INITIALIZER;

static void kernel_stub(void) {}

static double clock_s(clockid_t id)
{
    struct timespec t;
    clock_gettime(id, &t);
    return t.tv_sec + t.tv_nsec * 1e-9;
}

static double now_s(void) { return clock_s(CLOCK_MONOTONIC); }

static void launch_n(long n)
{
    dim3 grid = {64, 1, 1}, block = {128, 1, 1};
    for (long i = 0; i < n; i++)
        launch((const void *)kernel_stub, grid, block, NULL, 0, NULL);
}

/* Paced: batches of 64, sleeping whenever ahead of the per-thread schedule. */
static void *paced(void *arg)
{
    (void)arg;
    double start = now_s(), end = start + seconds;
    long done = 0;
    for (;;) {
        double t = now_s();
        if (t >= end)
            break;
        double ahead = (double)done / per_thread_rate - (t - start);
        if (ahead > 0) {
            struct timespec ts = {0, (long)(ahead * 1e9)};
            nanosleep(&ts, NULL);
            continue;
        }
        launch_n(64);
        done += 64;
    }
    pthread_mutex_lock(&total_lock);
    launched_total += done;
    pthread_mutex_unlock(&total_lock);
    return NULL;
}

static int listen_loopback(void)
{
    int s = socket(AF_INET, SOCK_STREAM, 0);
    struct sockaddr_in a = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(a);
    if (s < 0 || bind(s, (struct sockaddr *)&a, sizeof(a)) || listen(s, 4) ||
        getsockname(s, (struct sockaddr *)&a, &len)) {
        perror("listen");
        exit(1);
    }
    printf("port %d\n", ntohs(a.sin_port));
    return s;
}

/* One request head: the bench's clients send each in one write and wait for its answer. */
static void read_request(int c)
{
    char buf[1024];
    if (read(c, buf, sizeof(buf)) <= 0) {
        perror("read");
        exit(1);
    }
}

static int accept_request(int ls)
{
    int c = accept(ls, NULL, NULL);
    if (c < 0) {
        perror("accept");
        exit(1);
    }
    read_request(c);
    return c;
}

static void respond(int c)
{
    const char resp[] = "HTTP/1.1 200 OK\r\nContent-Length: 2\r\n\r\nok";
    if (write(c, resp, sizeof(resp) - 1) < 0)
        perror("write");
}

int main(int argc, char **argv)
{
    long iters = 1000000, reps = 5, threads = 1, rate = 0, requests = 0;
    int http = 0;
    if (argc < 2) {
        fprintf(stderr, "usage: %s LIBCUDART [options]\n", argv[0]);
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *v = i + 1 < argc ? argv[i + 1] : "0";
        if (!strcmp(argv[i], "--iters")) iters = atol(v), i++;
        else if (!strcmp(argv[i], "--reps")) reps = atol(v), i++;
        else if (!strcmp(argv[i], "--threads")) threads = atol(v), i++;
        else if (!strcmp(argv[i], "--rate")) rate = atol(v), i++;
        else if (!strcmp(argv[i], "--seconds")) seconds = atol(v), i++;
        else if (!strcmp(argv[i], "--requests")) requests = atol(v), i++;
        else if (!strcmp(argv[i], "--http")) http = 1;
        else { fprintf(stderr, "unknown option %s\n", argv[i]); return 2; }
    }
    void *lib = dlopen(argv[1], RTLD_NOW);
    launch = lib ? (launch_fn)dlsym(lib, "cudaLaunchKernel") : NULL;
    if (!launch) {
        fprintf(stderr, "cannot load cudaLaunchKernel: %s\n", dlerror());
        return 1;
    }
    launch_n(10000); /* warm-up: the first call initialises the runtime */
    int ls = http ? listen_loopback() : -1;
    printf("ready %d\n", getpid());
    fflush(stdout);
    char line[64];
    long warm;
    for (;;) { /* "warm N": N untimed launches more (answered "warmed"), until "go" */
        if (!fgets(line, sizeof(line), stdin))
            return 1;
        if (sscanf(line, "warm %ld", &warm) != 1)
            break;
        launch_n(warm);
        printf("warmed\n");
        fflush(stdout);
    }
    int conn = http ? accept_request(ls) : -1;
    if (rate > 0) {
        pthread_t tid[64];
        if (threads < 1 || threads > 64 || seconds < 1 || seconds > 600)
            return 2;
        per_thread_rate = rate / threads > 0 ? rate / threads : 1;
        double t0 = now_s();
        for (long i = 0; i < threads; i++)
            pthread_create(&tid[i], NULL, paced, NULL);
        for (long i = 0; i < threads; i++)
            pthread_join(tid[i], NULL);
        printf("launched %ld %.3f\n", launched_total, now_s() - t0);
    } else if (requests > 0 && conn >= 0) {
        for (long r = 0; r < reps; r++) {
            double wall = 0, cpu = 0;
            for (long k = 0; k < requests; k++) {
                if (k > 0 || r > 0)
                    read_request(conn);  /* the first was read by accept_request */
                double t0 = now_s(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
                launch_n(iters);
                cpu += clock_s(CLOCK_THREAD_CPUTIME_ID) - c0, wall += now_s() - t0;
                respond(conn);
            }
            printf("rep %ld %.2f %.2f\n", r, wall * 1e9 / (iters * requests), cpu * 1e9 / (iters * requests));
            fflush(stdout);
        }
        printf("launched %ld\n", iters * reps * requests);
        close(conn);
        conn = -1;
    } else {
        for (long r = 0; r < reps; r++) {
            double t0 = now_s(), c0 = clock_s(CLOCK_THREAD_CPUTIME_ID);
            launch_n(iters);
            double c1 = clock_s(CLOCK_THREAD_CPUTIME_ID), t1 = now_s();
            printf("rep %ld %.2f %.2f\n", r, (t1 - t0) * 1e9 / iters, (c1 - c0) * 1e9 / iters);
            fflush(stdout);
        }
        printf("launched %ld\n", iters * reps);
    }
    if (conn >= 0) {
        respond(conn);
        close(conn);
    }
    printf("done\n");
    fflush(stdout);
    return 0;
}
