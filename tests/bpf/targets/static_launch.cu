// nvcc's default links cudart statically: the collector must find and probe
// cudaLaunchKernel inside this executable. Launches N kernels once told "go".
#include <cuda_runtime.h>
#include <stdio.h>
#include <stdlib.h>

__global__ void scale_kernel(float *x, int n) {
    int i = blockIdx.x * blockDim.x + threadIdx.x;
    if (i < n) x[i] *= 2.0f;
}

int main(int argc, char **argv) {
    int n = argc > 1 ? atoi(argv[1]) : 10;
    char line[16];
    fprintf(stderr, "listening on 0\n");
    if (!fgets(line, sizeof line, stdin)) return 1;
    float *x = NULL;
    int len = 1024;
    void *args[] = {&x, &len};
    int rc = 0;
    for (int i = 0; i < n; i++)
        rc = cudaLaunchKernel((const void *)scale_kernel, dim3(5, 1, 1), dim3(64, 1, 1), args, 0, 0);
    fprintf(stderr, "launched %d rc=%d\n", n, rc);
    fgets(line, sizeof line, stdin);  // stay alive until the test is done
    return 0;
}
