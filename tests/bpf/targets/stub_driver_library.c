/* A library that launches its kernels through the driver API itself, as cuBLAS, cuDNN,
 * NCCL and Triton's launchers do (cuBLAS even links its own copy of cudart): its
 * cuLaunchKernel calls are launches of their own, never a runtime launch passing
 * through. Named as a stub; link it with the stub libcuda.so.1 (stub_libcuda.c). */
#include <stddef.h>

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *stream, void **params, void **extra);

int stub_library_launch(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                        unsigned shmem) {
    int rc = cuLaunchKernel(f, gx, gy, gz, bx, by, bz, shmem, NULL, NULL, NULL);
    return rc == 0 ? 0 : -1;
}
