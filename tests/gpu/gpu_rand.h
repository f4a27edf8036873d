/* gpu_rand.h - the GPU tests' random inputs: a fixed-seed splitmix64 stream, uniform in
 * [-1, 1) and never exactly 0, so a kernel that leaves an output untouched or zero shows.
 * Shared by gpu_util.h and the NCCL stand-in's shim of it. */
#ifndef COHORT_TESTS_GPU_GPU_RAND_H
#define COHORT_TESTS_GPU_GPU_RAND_H

#include <stdint.h>

static uint64_t gu__rng = 0x243F6A8885A308D3ull;

/* uniform in [-1, 1), never exactly 0 */
static inline float gu_uniform(void) {
    uint64_t z = (gu__rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = (float)((z >> 40) + 0.5) * (1.0f / 16777216.0f);
    return 2.0f * u - 1.0f;
}

static inline int gu_randint(int n) {
    int k = (int)(0.5f * (gu_uniform() + 1.0f) * (float)n);
    return k >= n ? n - 1 : (k < 0 ? 0 : k);
}

#endif
