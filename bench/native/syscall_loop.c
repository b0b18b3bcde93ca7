/* An untraced, non-CUDA process doing what a busy neighbour does: small reads and
 * writes on a pipe, or a ping-pong on an accepted loopback TCP connection. Prints
 * "rep <i> <ns per round trip>" for each repetition. Every round trip is two writes
 * and two reads (pipe) or four syscalls plus the TCP stack (tcp), so the figure
 * shows what the collector's syscall tracepoints add to a process they do not trace.
 *   syscall_loop pipe|tcp ITERATIONS REPS */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

/* This thread's CPU time, not wall time: on a shared 2-core VM the loop is preempted
 * often, and the tracepoints' cost is CPU spent inside our own syscalls. */
static double now_ns(void)
{
    struct timespec t;
    clock_gettime(CLOCK_THREAD_CPUTIME_ID, &t);
    return t.tv_sec * 1e9 + t.tv_nsec;
}

static void tcp_pair(int *a, int *b)
{
    struct sockaddr_in addr = {.sin_family = AF_INET, .sin_addr.s_addr = htonl(INADDR_LOOPBACK)};
    socklen_t len = sizeof(addr);
    int one = 1, srv = socket(AF_INET, SOCK_STREAM, 0);
    if (bind(srv, (struct sockaddr *)&addr, sizeof(addr)) || listen(srv, 1) ||
        getsockname(srv, (struct sockaddr *)&addr, &len))
        exit(1);
    *a = socket(AF_INET, SOCK_STREAM, 0);
    if (connect(*a, (struct sockaddr *)&addr, sizeof(addr)))
        exit(1);
    *b = accept(srv, NULL, NULL);  /* a server connection: the accept probes see it */
    setsockopt(*a, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    setsockopt(*b, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
    close(srv);
}

int main(int argc, char **argv)
{
    if (argc < 4)
        return 2;
    int tcp = strcmp(argv[1], "tcp") == 0;
    long n = atol(argv[2]), reps = atol(argv[3]);
    int a, b, p[2], q[2];
    char buf[64] = "GET / HTTP/1.1\r\n";  /* looks like HTTP: the untraced path must not care */
    if (tcp) {
        tcp_pair(&a, &b);
    } else {
        if (pipe(p) || pipe(q))
            return 1;
    }
    for (long r = 0; r < reps; r++) {
        double t0 = now_ns();
        for (long i = 0; i < n; i++) {
            if (tcp) {
                if (write(a, buf, 16) != 16 || read(b, buf, 16) != 16 || write(b, buf, 16) != 16 ||
                    read(a, buf, 16) != 16)
                    return 1;
            } else {
                if (write(p[1], buf, 16) != 16 || read(p[0], buf, 16) != 16 || write(q[1], buf, 16) != 16 ||
                    read(q[0], buf, 16) != 16)
                    return 1;
            }
        }
        printf("rep %ld %.1f\n", r, (now_ns() - t0) / n);
        fflush(stdout);
    }
    return 0;
}
