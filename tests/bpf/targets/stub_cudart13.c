/* A stand-in for the CUDA 13 runtime on a GPU (none here: the real libcudart 13
 * falls back to handle == host stub without a driver), exporting the <<<>>> path
 * with its real signatures: __cudaGetKernel hands out an opaque cudaKernel_t (a heap
 * address, NOT the host stub), and __cudaLaunchKernel passes it on to the exported
 * cudaLaunchKernel, as the real libcudart 12.9 and 13.0 do (a tail jump). Named as a
 * stub; it launches nothing. */
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;

/* What nvcc generates for `__global__ void vec_add(float *, int)`: a host stub with
 * the kernel's mangled name, whose address the launch code hands to __cudaGetKernel. */
void stub_vec_add(float *a, int n) __asm__("_Z7vec_addPfi");
void stub_vec_add(float *a, int n) { (void)a; (void)n; }

int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
    return 0;
}

int __cudaGetKernel(void **kernel, const void *hostStub) {
    *kernel = malloc(16);
    return 0;
}

int __cudaLaunchKernel(void *kernel, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
    return cudaLaunchKernel(kernel, grid, block, args, shmem, stream);
}

int __cudaLaunchKernel_ptsz(void *kernel, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
    return cudaLaunchKernel(kernel, grid, block, args, shmem, stream);
}
