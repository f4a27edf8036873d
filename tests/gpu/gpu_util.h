/* gpu_util.h - helpers of the GPU tests (suite `gpu`): skip without a GPU, the CPU reference
 * and CUDA backends side by side, random inputs (never zeros), comparisons. */
#ifndef COHORT_TESTS_GPU_GPU_UTIL_H
#define COHORT_TESTS_GPU_GPU_UTIL_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "tests/test.h"
#include "tests/gpu/gpu_rand.h"


/* Exits 77 (meson's skip) when this build or machine has no usable GPU. */
static inline void gu_require_gpu(void) {
    char why[256];
    if (!kb_cuda_available(why, sizeof why)) TEST_SKIP(why);
}

static inline kb_backend *gu_backend(kb_device dev, bool bf16) {
    /* the CPU reference takes bf16 on any CPU (oneDNN's slower paths where it has no bf16
     * instructions): the GPU tests must not depend on the host's CPU */
    kb_options o = {.device = dev, .threads = 2, .bf16 = bf16, .bf16_reference = dev == KB_DEVICE_CPU};
    kb_backend *b = NULL;
    if (kb_backend_new(&b, &o)) {
        fprintf(stderr, "cannot create the %s backend: %s\n", dev == KB_DEVICE_CUDA ? "CUDA" : "CPU", co_err_detail());
        exit(1);
    }
    return b;
}

/* A buffer of n floats in backend memory holding a copy of host (if not NULL). */
static inline float *gu_buf(kb_backend *b, const float *host, size_t n) {
    float *p = b->ops->alloc(b, (n ? n : 1) * sizeof(float));
    if (!p) {
        fprintf(stderr, "backend alloc of %zu floats failed\n", n);
        exit(1);
    }
    if (host) b->ops->copy(b, p, host, n * sizeof(float));
    return p;
}
static inline int32_t *gu_ibuf(kb_backend *b, const int32_t *host, size_t n) {
    int32_t *p = b->ops->alloc(b, (n ? n : 1) * sizeof(int32_t));
    if (!p) exit(1);
    if (host) b->ops->copy(b, p, host, n * sizeof(int32_t));
    return p;
}
static inline float *gu_rand(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = gu_uniform() * scale;
    return x;
}
/* host copy of backend memory (waits for the backend) */
static inline float *gu_fetch(kb_backend *b, const float *p, size_t n) {
    float *h = malloc((n ? n : 1) * sizeof(float));
    b->ops->copy(b, h, p, n * sizeof(float));
    return h;
}

/* max over i of |a-b| / (atol + rtol |b|): <= 1 means close; NaN counts as far */
static inline double gu_worst(const float *a, const float *b, size_t n, double atol, double rtol, size_t *at) {
    double w = 0;
    if (at) *at = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - (double)b[i]) / (atol + rtol * fabs((double)b[i]));
        if (!(e <= w)) {
            w = isnan(e) ? INFINITY : e;
            if (at) *at = i;
        }
    }
    return w;
}

#define GU_CLOSE(label, gpu, cpu, n, atol, rtol)                                                               \
    do {                                                                                                       \
        const float *gu__g = (gpu), *gu__c = (cpu);                                                            \
        size_t gu__at;                                                                                         \
        double gu__w = gu_worst(gu__g, gu__c, (n), (atol), (rtol), &gu__at);                                   \
        CHECK_MSG(gu__w <= 1.0, "%s: worst %.3g at %zu: gpu %.9g cpu %.9g", (label), gu__w, gu__at,            \
                  (double)gu__g[gu__at], (double)gu__c[gu__at]);                                               \
    } while (0)

#define GU_EQUAL(label, gpu, cpu, bytes)                                                                       \
    CHECK_MSG(memcmp((gpu), (cpu), (bytes)) == 0, "%s: not bitwise equal", (label))

#endif
