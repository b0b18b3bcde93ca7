/* A stand-in libcudart that behaves as the real one does on a GPU (none here: the real
 * one returns 35 before it reaches a driver): cudaLaunchKernel and cudaLaunchKernelExC
 * reach libcuda's cuLaunchKernel / cuLaunchKernelEx with the same launch, called from
 * this library's code, passing the driver a handle of its own for the host stub (a heap
 * block made at the stub's first launch, as the real runtime loads a kernel lazily).
 * Named as a stub; it launches nothing. Link it with the stub libcuda.so.1
 * (stub_libcuda.c). */
#include <stddef.h>
#include <pthread.h>
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;
typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;
typedef struct {
    dim3 gridDim, blockDim;
    size_t dynamicSmemBytes;
    void *stream;
    void *attrs;
    unsigned numAttrs;
} cudaLaunchConfig_t;

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *stream, void **params, void **extra);
int cuLaunchKernelEx(const CUlaunchConfig *config, void *f, void **params, void **extra);

/* Host stubs to launch, as a CUDA program's (they name their kernels): vec_add(float*, int)
 * and scale(float*, int). */
void stub_vec_add(float *a, int n) __asm__("_Z7vec_addPfi");
void stub_vec_add(float *a, int n) { if (a) a[0] += n; }
void stub_scale(float *a, int n) __asm__("_Z5scalePfi");
void stub_scale(float *a, int n) { if (a) a[0] *= n; }

/* Host stub -> handle, for the first KERNELS stubs launched; a stub past them is its own
 * handle (no test launches that many). */
#define KERNELS 64
static const void *stubs[KERNELS];
static void *handles[KERNELS];

static pthread_mutex_t lock = PTHREAD_MUTEX_INITIALIZER;

static void *handle_of(const void *func) {
    void *h = (void *)func;
    pthread_mutex_lock(&lock); /* threads launch at once */
    for (int i = 0; i < KERNELS; i++) {
        if (!stubs[i]) {
            stubs[i] = func;
            handles[i] = malloc(16);
        }
        if (stubs[i] == func) {
            h = handles[i];
            break;
        }
    }
    pthread_mutex_unlock(&lock);
    return h;
}

/* The driver's result mapped to a runtime error, as the real runtime does: work after
 * the call, so it is a call from here (never a tail jump). */
static int runtime_error(int rc) { return rc == 0 ? 0 : 719; }

int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
    int rc = cuLaunchKernel(handle_of(func), grid.x, grid.y, grid.z, block.x, block.y, block.z, (unsigned)shmem,
                            stream, args, NULL);
    return runtime_error(rc);
}

int cudaLaunchKernelExC(const cudaLaunchConfig_t *config, const void *func, void **args) {
    CUlaunchConfig c = {config->gridDim.x, config->gridDim.y, config->gridDim.z, config->blockDim.x,
                        config->blockDim.y, config->blockDim.z, (unsigned)config->dynamicSmemBytes,
                        config->stream, NULL, 0};
    int rc = cuLaunchKernelEx(&c, handle_of(func), args, NULL);
    return runtime_error(rc);
}
