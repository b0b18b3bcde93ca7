/* A stand-in for libcudart's CUDA graph path (the real libcudart cannot capture
 * without a device), exporting the real symbols and signatures: cudaLaunchKernel (it
 * launches nothing), stream capture begin/end, instantiate, launch and destroy. As the
 * real runtime does, each graph call goes on to the driver's (stub_libcuda_graphs.c,
 * when the process loaded it with RTLD_GLOBAL), so both probes fire for one call. Host
 * stubs of three kernels, with nvcc's mangled names, give launches something to name.
 * Named as a stub. */
#include <dlfcn.h>
#include <stdlib.h>

typedef struct { unsigned x, y, z; } dim3;

void stub_gemm(float *a, int n) __asm__("_Z9gemm_tilePfi");
void stub_gemm(float *a, int n) { (void)a; (void)n; }
void stub_relu(float *a, int n) __asm__("_Z4reluPfi");
void stub_relu(float *a, int n) { (void)a; (void)n; }
void stub_copy(float *a, int n) __asm__("_Z9copy_sidePfi");
void stub_copy(float *a, int n) { (void)a; (void)n; }

int cudaLaunchKernel(const void *func, dim3 grid, dim3 block, void **args, size_t shmem, void *stream) {
    return 0;
}

static void *driver(const char *name) { return dlsym(RTLD_DEFAULT, name); }

int cudaStreamBeginCapture(void *stream, int mode) {
    int (*f)(void *, int) = driver("cuStreamBeginCapture_v2");
    return f ? f(stream, mode) : 0;
}

int cudaStreamEndCapture(void *stream, void **pGraph) {
    int (*f)(void *, void **) = driver("cuStreamEndCapture");
    if (f)
        return f(stream, pGraph);
    *pGraph = malloc(64);
    return 0;
}

int cudaGraphInstantiate(void **pGraphExec, void *graph, unsigned long long flags) {
    int (*f)(void **, void *, unsigned long long) = driver("cuGraphInstantiateWithFlags");
    if (f)
        return f(pGraphExec, graph, flags);
    *pGraphExec = malloc(64);
    return 0;
}

int cudaGraphLaunch(void *graphExec, void *stream) {
    int (*f)(void *, void *) = driver("cuGraphLaunch");
    return f ? f(graphExec, stream) : 0;
}

int cudaGraphExecDestroy(void *graphExec) {
    int (*f)(void *) = driver("cuGraphExecDestroy");
    return f ? f(graphExec) : 0;
}

int cudaGraphDestroy(void *graph) {
    int (*f)(void *) = driver("cuGraphDestroy");
    return f ? f(graph) : 0;
}
