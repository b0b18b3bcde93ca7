/* A stand-in for the driver's CUDA graph entry points (no GPU here: the real driver is
 * absent), with their real signatures: stream capture begin/end, instantiate, launch,
 * destroy. Handles are heap addresses, as opaque as the driver's. Named as a stub; it
 * captures and launches nothing. stub_cudart_graphs.c calls into it, as libcudart does. */
#include <stdlib.h>

int cuStreamBeginCapture_v2(void *hStream, int mode) { (void)hStream; (void)mode; return 0; }
int cuStreamEndCapture(void *hStream, void **phGraph) { (void)hStream; *phGraph = malloc(64); return 0; }
int cuGraphInstantiateWithFlags(void **phGraphExec, void *hGraph, unsigned long long flags) {
    (void)hGraph; (void)flags;
    *phGraphExec = malloc(64);
    return 0;
}
int cuGraphLaunch(void *hGraphExec, void *hStream) { (void)hGraphExec; (void)hStream; return 0; }
int cuGraphExecDestroy(void *hGraphExec) { free(hGraphExec); return 0; }
int cuGraphDestroy(void *hGraph) { free(hGraph); return 0; }
