/* moe_perm.c - the MoE layer's token permutations on the CPU (backend.h: gather_rows,
 * gather_rows_bf16, combine_rows, combine_backward): the reference the CUDA kernels
 * (kernels/cuda/cuda_moe.cu) match bit for bit. Rows are spread over the threads; each
 * output element is computed by one thread in the order backend.h gives (fused multiply-adds
 * spelled fmaf, as the GPU's), so the bits do not depend on the thread count. */
#include "kernels/cpu/cpu.h"

#include <math.h>
#include <string.h>

void cpu_gather_rows(kb_backend *b, float *out, const float *in, const int32_t *idx, int M, int C) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int r = 0; r < M; r++) {
        size_t s = idx ? (size_t)idx[r] : (size_t)r;
        memcpy(out + (size_t)r * C, in + s * C, sizeof(float) * (size_t)C);
    }
}

void cpu_gather_rows_bf16(kb_backend *b, float *out, const kb_bf16 *in, const int32_t *idx, int M, int C) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int r = 0; r < M; r++) {
        const kb_bf16 *x = in + (idx ? (size_t)idx[r] : (size_t)r) * C;
        float *o = out + (size_t)r * C;
        for (int q = 0; q < C; q++) {
            uint32_t u = (uint32_t)x[q] << 16;
            memcpy(&o[q], &u, sizeof u);
        }
    }
}

void cpu_combine_rows(kb_backend *b, float *y, const float *src, const int32_t *off, const int32_t *row,
                      const float *w, int N, int C, bool acc) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        float *yn = y + (size_t)n * C;
        if (!acc) memset(yn, 0, sizeof(float) * (size_t)C);
        for (int j = off[n]; j < off[n + 1]; j++) {
            const float *s = src + (size_t)row[j] * C;
            if (w) {
                float p = w[j];
                for (int q = 0; q < C; q++) yn[q] = fmaf(p, s[q], yn[q]);
            } else {
                for (int q = 0; q < C; q++) yn[q] += s[q];
            }
        }
    }
}

void cpu_combine_backward(kb_backend *b, float *dout, double *dw, const float *dy, const float *out,
                          const int32_t *idx, const float *w, int M, int C) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int r = 0; r < M; r++) {
        const float *d = dy + (size_t)idx[r] * C, *o = out + (size_t)r * C;
        float *g = dout + (size_t)r * C, p = w[r];
        double dot = 0;
        for (int q = 0; q < C; q++) {
            dot += (double)d[q] * (double)o[q]; /* (exact products: no fma question) */
            g[q] = p * d[q];
        }
        dw[r] = dot;
    }
}
