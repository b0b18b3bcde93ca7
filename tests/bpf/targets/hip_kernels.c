/* Kernel handles as hipcc's host code has them: since LLVM 13 a HIP kernel's host-side
 * symbol is a data object named with the kernel's mangled name (what hipLaunchKernel is
 * passed and __hipRegisterFunction registers), not a function. Built by the tests with
 * gcc; the device code is not needed without a GPU. */
const char vector_add[8] __asm__("_Z10vector_addPKfS0_Pfi") = {1};
const char reduce_sum[8] __asm__("_Z10reduce_sumPKfPfi") = {2};
