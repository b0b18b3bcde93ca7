/* Host-side stand-ins for CUDA kernels: named functions whose addresses the demo
 * passes to cudaLaunchKernel, so the collector resolves and demangles real symbol
 * names. Names are Itanium-mangled as nvcc would emit them for C++ kernels. */
void _Z11matmul_tilePKfS0_Pfi(void) {}
void _Z14softmax_kernelPfi(void) {}
void _Z16layernorm_kernelPKfPfi(void) {}
void _Z12embed_gatherPKiPKfPfi(void) {}

/* A model's layers: 32 more kernels, for a request that launches many distinct ones
 * (bench/http_service.py GET /layers). layer_NN(float*). */
#define LAYER(n) void _Z8layer_##n##Pf(void) {}
LAYER(00) LAYER(01) LAYER(02) LAYER(03) LAYER(04) LAYER(05) LAYER(06) LAYER(07)
LAYER(08) LAYER(09) LAYER(10) LAYER(11) LAYER(12) LAYER(13) LAYER(14) LAYER(15)
LAYER(16) LAYER(17) LAYER(18) LAYER(19) LAYER(20) LAYER(21) LAYER(22) LAYER(23)
LAYER(24) LAYER(25) LAYER(26) LAYER(27) LAYER(28) LAYER(29) LAYER(30) LAYER(31)
