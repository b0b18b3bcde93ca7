/* A stand-in libcudart whose synchronising calls wait off the CPU as the real one does
 * when the GPU is busy (its blocking-sync mode): each sleeps the milliseconds that
 * STUB_SYNC_MS says (40 by default). Named as a stub; no GPU is involved. Built without
 * optimisation, so each entry starts with a push, as the real library's do. */
#include <stdlib.h>
#include <time.h>

static void wait_for_the_gpu(void)
{
    const char *ms = getenv("STUB_SYNC_MS");
    long n = ms ? atol(ms) : 40;
    struct timespec t = {n / 1000, (n % 1000) * 1000000L};
    while (nanosleep(&t, &t) != 0)
        ;
}

int cudaDeviceSynchronize(void) { wait_for_the_gpu(); return 0; }
int cudaStreamSynchronize(void *stream) { (void)stream; wait_for_the_gpu(); return 0; }
