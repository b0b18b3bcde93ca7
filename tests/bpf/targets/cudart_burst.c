/* Short-lived CUDA process: dlopen(argv[1]) (a libcudart), then argv[2] kernel
 * launches through cudaLaunchKernel, and exit. Without a GPU each call returns
 * 35; the probes see the same arguments. Prints "pid N launches K" on stdout. */
#include <dlfcn.h>
#include <stdio.h>
#include <stdlib.h>
#include <unistd.h>

typedef struct { unsigned x, y, z; } dim3;
typedef int (*launch_fn)(const void *, dim3, dim3, void **, size_t, void *);

int main(int argc, char **argv)
{
    if (argc < 3)
        return 2;
    void *h = dlopen(argv[1], RTLD_NOW | RTLD_LOCAL);
    if (!h) {
        fprintf(stderr, "dlopen: %s\n", dlerror());
        return 1;
    }
    launch_fn launch = (launch_fn)dlsym(h, "cudaLaunchKernel");
    if (!launch)
        return 1;
    int k = atoi(argv[2]);
    dim3 grid = {3, 1, 1}, block = {32, 1, 1};
    for (int i = 0; i < k; i++)
        launch((const void *)main, grid, block, NULL, 0, NULL);
    printf("pid %d launches %d\n", (int)getpid(), k);
    return 0;
}
