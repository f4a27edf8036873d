/* gpu_util_shim.h - TEST-ONLY: stands in for tests/gpu/gpu_util.h (force-included, -include)
 * when tests/gpu/test_gpu_nccl.c is built unchanged against the NCCL stand-in and the test
 * runtime stub: the helpers that test uses, without the kernels backend behind the real one
 * (which would need the CUDA module). */
#ifndef COHORT_TESTS_GPU_GPU_UTIL_H
#define COHORT_TESTS_GPU_GPU_UTIL_H

#include "common/error.h"
#include "tests/test.h"
#include "tests/gpu/gpu_rand.h"

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

/* the stand-ins are always there */
static inline void gu_require_gpu(void) {}

#define GU_EQUAL(label, gpu, cpu, bytes) CHECK_MSG(memcmp((gpu), (cpu), (bytes)) == 0, "%s: not bitwise equal", (label))

#endif
