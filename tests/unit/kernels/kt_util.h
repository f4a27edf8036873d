/* kt_util.h - helpers shared by the kernel tests: random inputs, backends, buffers. */
#ifndef COHORT_TESTS_UNIT_KERNELS_KT_UTIL_H
#define COHORT_TESTS_UNIT_KERNELS_KT_UTIL_H

#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "kernels/backend.h"
#include "tests/test.h"

static uint64_t kt__rng = 0x1234567887654321ull;

/* uniform in [-1, 1), never exactly 0 */
static inline float kt_uniform(void) {
    uint64_t z = (kt__rng += 0x9E3779B97F4A7C15ull);
    z = (z ^ (z >> 30)) * 0xBF58476D1CE4E5B9ull;
    z = (z ^ (z >> 27)) * 0x94D049BB133111EBull;
    z ^= z >> 31;
    float u = (float)((z >> 40) + 0.5) * (1.0f / 16777216.0f);
    return 2.0f * u - 1.0f;
}

static inline int kt_randint(int n) {
    float u = 0.5f * (kt_uniform() + 1.0f);
    int k = (int)(u * (float)n);
    return k >= n ? n - 1 : (k < 0 ? 0 : k);
}

static inline float *kt_rand(size_t n, float scale) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = kt_uniform() * scale;
    return x;
}

static inline float *kt_copy(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    memcpy(y, x, n * sizeof(float));
    return y;
}

static inline double *kt_dcopy(const float *x, size_t n) {
    double *y = malloc((n ? n : 1) * sizeof(double));
    for (size_t i = 0; i < n; i++) y[i] = x[i];
    return y;
}

static inline kb_backend *kt_backend(int threads, bool bf16) {
    kb_options o = {.device = KB_DEVICE_CPU, .threads = threads, .bf16 = bf16};
    kb_backend *b = NULL;
    if (kb_backend_new(&b, &o) != 0) {
        fprintf(stderr, "cannot create the CPU backend\n");
        exit(1);
    }
    return b;
}

/* max |a-b| / (atol + rtol*|b|) over the arrays; <= 1 means close */
static inline double kt_worst(const float *a, const double *b, size_t n, double atol,
                              double rtol) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double e = fabs((double)a[i] - b[i]) / (atol + rtol * fabs(b[i]));
        if (!(e <= w)) w = e; /* NaN propagates */
    }
    return w;
}

static inline double kt_bf(float f) {
    uint32_t u;
    memcpy(&u, &f, 4);
    u += 0x7fffu + ((u >> 16) & 1u);
    u &= 0xffff0000u;
    float r;
    memcpy(&r, &u, 4);
    return r;
}

#endif
