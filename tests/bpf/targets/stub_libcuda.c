/* A stand-in libcuda (no real driver exists without a GPU) exporting the driver
 * launch entry points with their real signatures, so the driver-API probes can be
 * tested. Named as a stub; it does nothing and returns CUDA_SUCCESS. The calls that
 * hand out kernel handles give opaque heap addresses, as the real driver does. */
#include <stdlib.h>
#include <string.h>

typedef struct {
    unsigned gridDimX, gridDimY, gridDimZ, blockDimX, blockDimY, blockDimZ, sharedMemBytes;
    void *hStream;
    void *attrs;
    unsigned numAttrs;
} CUlaunchConfig;

int cuLaunchKernel(void *f, unsigned gx, unsigned gy, unsigned gz, unsigned bx, unsigned by, unsigned bz,
                   unsigned shmem, void *stream, void **params, void **extra) {
    return 0;
}

int cuLaunchKernelEx(const CUlaunchConfig *config, void *f, void **params, void **extra) {
    return 0;
}

/* Handles: fresh heap blocks (no symbol names them). Names starting with "missing"
 * are not found, as for a kernel the module lacks: CUDA_ERROR_NOT_FOUND, *out untouched. */
#define CUDA_ERROR_NOT_FOUND 500

static int hand_out(void **out, const char *name) {
    if (name && (unsigned long)name < 4096)
        return 1; /* CUDA_ERROR_INVALID_VALUE: a name pointer no one can read */
    if (name && strncmp(name, "missing", 7) == 0)
        return CUDA_ERROR_NOT_FOUND;
    *out = malloc(16);
    return 0;
}

int cuModuleGetFunction(void **hfunc, void *hmod, const char *name) { return hand_out(hfunc, name); }

int cuLibraryGetKernel(void **pKernel, void *library, const char *name) { return hand_out(pKernel, name); }

int cuKernelGetFunction(void **pFunc, void *kernel) { return hand_out(pFunc, NULL); }
