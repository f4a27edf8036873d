/* ring_ops.c - ring attention's bookkeeping on the CPU (backend.h: ring_merge, bf16_to_f32;
 * its copies are copy_rows, cpu_backend.c): the loops model/ring_attention.c ran on the host
 * before they became backend operations, so that the CUDA backend (kernels/cuda/cuda_ring.cu) runs the same math on its
 * stream. Each row is independent; the bits do not depend on the thread count. */
#include <math.h>
#include <string.h>

#include "kernels/cpu/cpu.h"

void cpu_ring_merge(kb_backend *b, float *out, float *lse, const float *po, const float *pl, int B, int nh, int hd,
                    int L, int q0, int nq) {
    (void)b;
#pragma omp parallel for schedule(static)
    for (int bh = 0; bh < B * nh; bh++) {
        const int bb = bh / nh, h = bh % nh;
        for (int t = 0; t < nq; t++) {
            const float ls = pl[(size_t)bh * nq + t];
            if (ls == -INFINITY) continue; /* nothing seen in this block */
            float *lo = lse + (size_t)bh * L + q0 + t;
            const float mx = *lo > ls ? *lo : ls, mn = *lo > ls ? ls : *lo;
            const float ln = mx + log1pf(expf(mn - mx));
            const float ca = expf(*lo - ln), cb = expf(ls - ln);
            float *o = out + ((size_t)bb * L + q0 + t) * nh * hd + (size_t)h * hd;
            const float *p = po + ((size_t)bb * nq + t) * nh * hd + (size_t)h * hd;
            for (int c = 0; c < hd; c++) o[c] = o[c] * ca + p[c] * cb;
            *lo = ln;
        }
    }
}

void cpu_bf16_to_f32(kb_backend *b, float *dst, const kb_bf16 *src, size_t n) {
    (void)b;
    for (size_t i = 0; i < n; i++) {
        const uint32_t w = (uint32_t)src[i] << 16;
        memcpy(dst + i, &w, sizeof w);
    }
}
