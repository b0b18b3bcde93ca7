/* A library built with CET (-fcf-protection=full), as Ubuntu's and NVIDIA's toolchains
 * build theirs: every function starts with endbr64. probed() has a frame (it calls
 * helper()), so a push follows: tests/bpf/test_prologue_probes.py probes it past the
 * endbr64. */
__attribute__((noinline)) long helper(long x) { __asm__ volatile("" ::: "memory"); return x; }

long probed(long x) {
    long r = helper(x);
    __asm__ volatile("" ::: "memory");
    return r + 1;
}
