/* gpu_util_shim.h - TEST-ONLY: stands in for tests/gpu/gpu_util.h (force-included, -include)
 * when tests/gpu/test_gpu_nccl.c is built unchanged against the NCCL stand-in and the test
 * runtime stub: the helpers that test uses, without the kernels backend behind the real one
 * (which would need the CUDA module). */
#ifndef COHORT_TESTS_GPU_GPU_UTIL_H
#define COHORT_TESTS_GPU_GPU_UTIL_H

#include "common/error.h"
#include "tests/test.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

static uint64_t gu__rng = 0x243F6A8885A308D3ull;

/* uniform in [-1, 1), never exactly 0 (as gpu_util.h's) */
static inline float gu_uniform(void) {
    uint64_t z = (gu__rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = (float)((z >> 40) + 0.5) * (1.0f / 16777216.0f);
    return 2.0f * u - 1.0f;
}

/* the stand-ins are always there */
static inline void gu_require_gpu(void) {}

#define GU_EQUAL(label, gpu, cpu, bytes) CHECK_MSG(memcmp((gpu), (cpu), (bytes)) == 0, "%s: not bitwise equal", (label))

#endif
