/* attn_tiles.h - the register-blocked micro kernels of the CPU attention kernels
 * (attention.c: the one-rank causal kernel; block_attention.c: the blocks of ring attention),
 * included by each of them in every per-instruction-set build (kernels/meson.build:
 * -DCPU_ATTN_VARIANT=avx512, avx2 or base). Every lane accumulates in a fixed order with
 * fused multiply-adds, so results do not depend on the thread count. */
#ifndef COHORT_KERNELS_CPU_ATTN_TILES_H
#define COHORT_KERNELS_CPU_ATTN_TILES_H

#include <math.h>
#include <stddef.h>

#define BQ 64
#define BK 64
#define AI static inline __attribute__((always_inline))

#if defined(__AVX512F__) || defined(__AVX2__)
#include <immintrin.h>
#endif
#if defined(__AVX2__) && defined(__FMA__) && !defined(__AVX512F__)
#define ATTN_AVX2 1
#endif

/* the variant's names: cpu_attention_forward_avx512, ... (see cpu.h) */
#ifndef CPU_ATTN_VARIANT
#define CPU_ATTN_VARIANT base
#endif
#define ATTN_CAT2(a, b) a##_##b
#define ATTN_CAT(a, b) ATTN_CAT2(a, b)
#define ATTN_FN(name) ATTN_CAT(name, CPU_ATTN_VARIANT)

/* S[r][0:BK] = sum_d A[r*as + d] * Bt[d*BK + 0:BK] for r < nr (nr <= 4). */
AI void mk_a(float *S, const float *A, size_t as, const float *Bt, int hd, const int nr) {
#if defined(__AVX512F__)
    __m512 c[4][4];
    for (int r = 0; r < nr; r++)
        for (int q = 0; q < 4; q++) c[r][q] = _mm512_setzero_ps();
    for (int d = 0; d < hd; d++) {
        const float *b = Bt + (size_t)d * BK;
        __m512 b0 = _mm512_loadu_ps(b), b1 = _mm512_loadu_ps(b + 16);
        __m512 b2 = _mm512_loadu_ps(b + 32), b3 = _mm512_loadu_ps(b + 48);
        for (int r = 0; r < nr; r++) {
            __m512 a = _mm512_set1_ps(A[(size_t)r * as + d]);
            c[r][0] = _mm512_fmadd_ps(a, b0, c[r][0]);
            c[r][1] = _mm512_fmadd_ps(a, b1, c[r][1]);
            c[r][2] = _mm512_fmadd_ps(a, b2, c[r][2]);
            c[r][3] = _mm512_fmadd_ps(a, b3, c[r][3]);
        }
    }
    for (int r = 0; r < nr; r++)
        for (int q = 0; q < 4; q++) _mm512_storeu_ps(S + (size_t)r * BK + 16 * q, c[r][q]);
#elif defined(ATTN_AVX2)
    /* 16 ymm registers: the block's 64 columns in four quarters of 16, 4 rows x 2 each */
    for (int j = 0; j < BK; j += 16) {
        __m256 c[4][2];
        for (int r = 0; r < nr; r++) c[r][0] = c[r][1] = _mm256_setzero_ps();
        for (int d = 0; d < hd; d++) {
            const float *b = Bt + (size_t)d * BK + j;
            __m256 b0 = _mm256_loadu_ps(b), b1 = _mm256_loadu_ps(b + 8);
            for (int r = 0; r < nr; r++) {
                __m256 a = _mm256_broadcast_ss(A + (size_t)r * as + d);
                c[r][0] = _mm256_fmadd_ps(a, b0, c[r][0]);
                c[r][1] = _mm256_fmadd_ps(a, b1, c[r][1]);
            }
        }
        for (int r = 0; r < nr; r++) {
            _mm256_storeu_ps(S + (size_t)r * BK + j, c[r][0]);
            _mm256_storeu_ps(S + (size_t)r * BK + j + 8, c[r][1]);
        }
    }
#else
    for (int r = 0; r < nr; r++) {
        float *s = S + (size_t)r * BK;
        for (int j = 0; j < BK; j++) s[j] = 0.0f;
        for (int d = 0; d < hd; d++) {
            const float a = A[(size_t)r * as + d];
            const float *b = Bt + (size_t)d * BK;
            for (int j = 0; j < BK; j++) s[j] += a * b[j];
        }
    }
#endif
}

/* O[r*os + 0:hd] += sum_{k<nk} P[r*ps + k] * X[k*xs + 0:hd] for r < nr (nr <= 4). */
AI void mk_b(float *O, size_t os, const float *P, size_t ps, const float *X, size_t xs, int nk,
             int hd, const int nr) {
    int d0 = 0;
#if defined(__AVX512F__)
    for (; d0 + 64 <= hd; d0 += 64) {
        __m512 c[4][4];
        for (int r = 0; r < nr; r++)
            for (int q = 0; q < 4; q++) c[r][q] = _mm512_loadu_ps(O + (size_t)r * os + d0 + 16 * q);
        for (int k = 0; k < nk; k++) {
            const float *x = X + (size_t)k * xs + d0;
            __m512 x0 = _mm512_loadu_ps(x), x1 = _mm512_loadu_ps(x + 16);
            __m512 x2 = _mm512_loadu_ps(x + 32), x3 = _mm512_loadu_ps(x + 48);
            for (int r = 0; r < nr; r++) {
                __m512 p = _mm512_set1_ps(P[(size_t)r * ps + k]);
                c[r][0] = _mm512_fmadd_ps(p, x0, c[r][0]);
                c[r][1] = _mm512_fmadd_ps(p, x1, c[r][1]);
                c[r][2] = _mm512_fmadd_ps(p, x2, c[r][2]);
                c[r][3] = _mm512_fmadd_ps(p, x3, c[r][3]);
            }
        }
        for (int r = 0; r < nr; r++)
            for (int q = 0; q < 4; q++) _mm512_storeu_ps(O + (size_t)r * os + d0 + 16 * q, c[r][q]);
    }
    for (; d0 + 16 <= hd; d0 += 16) {
        __m512 c[4];
        for (int r = 0; r < nr; r++) c[r] = _mm512_loadu_ps(O + (size_t)r * os + d0);
        for (int k = 0; k < nk; k++) {
            __m512 x0 = _mm512_loadu_ps(X + (size_t)k * xs + d0);
            for (int r = 0; r < nr; r++)
                c[r] = _mm512_fmadd_ps(_mm512_set1_ps(P[(size_t)r * ps + k]), x0, c[r]);
        }
        for (int r = 0; r < nr; r++) _mm512_storeu_ps(O + (size_t)r * os + d0, c[r]);
    }
#elif defined(ATTN_AVX2)
    for (; d0 + 16 <= hd; d0 += 16) {
        __m256 c[4][2];
        for (int r = 0; r < nr; r++) {
            c[r][0] = _mm256_loadu_ps(O + (size_t)r * os + d0);
            c[r][1] = _mm256_loadu_ps(O + (size_t)r * os + d0 + 8);
        }
        for (int k = 0; k < nk; k++) {
            const float *x = X + (size_t)k * xs + d0;
            __m256 x0 = _mm256_loadu_ps(x), x1 = _mm256_loadu_ps(x + 8);
            for (int r = 0; r < nr; r++) {
                __m256 p = _mm256_broadcast_ss(P + (size_t)r * ps + k);
                c[r][0] = _mm256_fmadd_ps(p, x0, c[r][0]);
                c[r][1] = _mm256_fmadd_ps(p, x1, c[r][1]);
            }
        }
        for (int r = 0; r < nr; r++) {
            _mm256_storeu_ps(O + (size_t)r * os + d0, c[r][0]);
            _mm256_storeu_ps(O + (size_t)r * os + d0 + 8, c[r][1]);
        }
    }
#endif
    if (d0 < hd)
        for (int r = 0; r < nr; r++) {
            float *o = O + (size_t)r * os;
            for (int k = 0; k < nk; k++) {
                const float p = P[(size_t)r * ps + k];
                const float *x = X + (size_t)k * xs;
                for (int d = d0; d < hd; d++) o[d] += p * x[d];
            }
        }
}

/* max of s[lo..hi) (0 <= lo < hi <= BK) */
AI float row_max(const float *s, int lo, int hi) {
#if defined(__AVX512F__)
    __m512 m = _mm512_set1_ps(-INFINITY);
    for (int j = 0; j < BK; j += 16) {
        int a = lo - j, e = hi - j;
        a = a < 0 ? 0 : (a > 16 ? 16 : a);
        e = e < 0 ? 0 : (e > 16 ? 16 : e);
        const __mmask16 k = (__mmask16)(((1u << e) - 1u) & ~((1u << a) - 1u));
        m = _mm512_mask_max_ps(m, k, m, _mm512_loadu_ps(s + j));
    }
    return _mm512_reduce_max_ps(m);
#elif defined(ATTN_AVX2)
    const __m256 ninf = _mm256_set1_ps(-INFINITY);
    const __m256i lov = _mm256_set1_epi32(lo - 1), hiv = _mm256_set1_epi32(hi);
    __m256i idx = _mm256_setr_epi32(0, 1, 2, 3, 4, 5, 6, 7);
    __m256 m = ninf;
    for (int j = 0; j < BK; j += 8) {
        /* lanes with lo <= j+l < hi */
        __m256i in = _mm256_and_si256(_mm256_cmpgt_epi32(idx, lov), _mm256_cmpgt_epi32(hiv, idx));
        __m256 v = _mm256_blendv_ps(ninf, _mm256_loadu_ps(s + j), _mm256_castsi256_ps(in));
        m = _mm256_max_ps(m, v);
        idx = _mm256_add_epi32(idx, _mm256_set1_epi32(8));
    }
    __m128 h = _mm_max_ps(_mm256_castps256_ps128(m), _mm256_extractf128_ps(m, 1));
    h = _mm_max_ps(h, _mm_movehl_ps(h, h));
    h = _mm_max_ss(h, _mm_shuffle_ps(h, h, 1));
    return _mm_cvtss_f32(h);
#else
    float m = -INFINITY;
    for (int j = lo; j < hi; j++) m = s[j] > m ? s[j] : m;
    return m;
#endif
}

/* the same for any row count: groups of 4, then the remainder */
static inline void mk_a_rows(float *S, const float *A, size_t as, const float *Bt, int hd, int n) {
    int r = 0;
    for (; r + 4 <= n; r += 4) mk_a(S + (size_t)r * BK, A + (size_t)r * as, as, Bt, hd, 4);
    for (; r < n; r++) mk_a(S + (size_t)r * BK, A + (size_t)r * as, as, Bt, hd, 1);
}

/* rows r of O use k < nkr[r] (entries of P beyond are zero anyway; this only skips work) */
static inline void mk_b_rows(float *O, size_t os, const float *P, size_t ps, const float *X,
                             size_t xs, const int *nkr, int hd, int n) {
    int r = 0;
    for (; r + 4 <= n; r += 4) {
        int nk = nkr[r];
        for (int q = 1; q < 4; q++) nk = nkr[r + q] > nk ? nkr[r + q] : nk;
        if (nk > 0) mk_b(O + (size_t)r * os, os, P + (size_t)r * ps, ps, X, xs, nk, hd, 4);
    }
    for (; r < n; r++)
        if (nkr[r] > 0) mk_b(O + (size_t)r * os, os, P + (size_t)r * ps, ps, X, xs, nkr[r], hd, 1);
}

#endif
