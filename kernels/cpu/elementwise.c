/* elementwise.c - embeddings, normalisation, rope, activations, dropout, loss, optimizer.
 *
 * Every parallel loop uses a static schedule over a fixed partition (fixed-size chunks or
 * st->threads partitions), so results do not depend on which thread ran what. Reductions
 * use fixed lane arrays (vectorised by the compiler) summed in a fixed order. */
#include <omp.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"
#include "kernels/checksum.h"
#include "common/error.h"

#define CHUNK ((size_t)16384)
#define NCHUNK(n) (((n) + CHUNK - 1) / CHUNK)
#define CHUNK_BOUNDS(c, n)                                                                  \
    size_t lo = (c) * CHUNK, hi = lo + CHUNK < (n) ? lo + CHUNK : (n)

enum { LANES = 16 };

static inline float lane_sum(const float *acc) {
    /* fixed pairwise order */
    float s8[8], s4[4];
    for (int i = 0; i < 8; i++) s8[i] = acc[i] + acc[i + 8];
    for (int i = 0; i < 4; i++) s4[i] = s8[i] + s8[i + 4];
    return (s4[0] + s4[2]) + (s4[1] + s4[3]);
}

static inline float row_max(const float *x, int V) {
    float mx[LANES];
    for (int l = 0; l < LANES; l++) mx[l] = -INFINITY;
    int i = 0;
    for (; i + LANES <= V; i += LANES)
        for (int l = 0; l < LANES; l++) mx[l] = x[i + l] > mx[l] ? x[i + l] : mx[l];
    for (int l = 0; i < V; i++, l++) mx[l] = x[i] > mx[l] ? x[i] : mx[l];
    float m = mx[0];
    for (int l = 1; l < LANES; l++) m = mx[l] > m ? mx[l] : m;
    return m;
}

static inline float row_sum(const float *x, int C) {
    float acc[LANES] = {0};
    int i = 0;
    for (; i + LANES <= C; i += LANES)
        for (int l = 0; l < LANES; l++) acc[l] += x[i + l];
    for (int l = 0; i < C; i++, l++) acc[l] += x[i];
    return lane_sum(acc);
}

/* ---- memory ---- */

void cpu_zero(kb_backend *b, float *x, size_t n) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < NCHUNK(n); c++) {
        CHUNK_BOUNDS(c, n);
        memset(x + lo, 0, (hi - lo) * sizeof(float));
    }
}

void cpu_to_bf16(kb_backend *b, kb_bf16 *dst16, const float *src, size_t n) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < NCHUNK(n); c++) {
        CHUNK_BOUNDS(c, n);
        if (st->fp16)
            for (size_t i = lo; i < hi; i++) dst16[i] = cpu_f2h(src[i]);
        else
            for (size_t i = lo; i < hi; i++) dst16[i] = cpu_f2bf(src[i]);
    }
}

/* ---- embeddings ---- */

void cpu_embed_forward(kb_backend *b, float *out, const int32_t *tok, const int32_t *pos,
                       const float *wte, const float *wpe, int N, int C) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        float *o = out + (size_t)n * C;
        if (tok[n] < 0) {
            /* another vocabulary shard's token: zero here (plus the position) */
            if (wpe) memcpy(o, wpe + (size_t)pos[n] * C, (size_t)C * sizeof(float));
            else memset(o, 0, (size_t)C * sizeof(float));
            continue;
        }
        const float *e = wte + (size_t)tok[n] * C;
        if (wpe) {
            const float *p = wpe + (size_t)pos[n] * C;
            for (int c = 0; c < C; c++) o[c] = e[c] + p[c];
        } else {
            memcpy(o, e, (size_t)C * sizeof(float));
        }
    }
}

void cpu_embed_backward(kb_backend *b, float *dwte, float *dwpe, const float *dout,
                        const int32_t *tok, const int32_t *pos, int N, int C, int V) {
    cpu_state *st = cpu_st(b);
    (void)V;
    /* channel blocks in parallel; within a block tokens are walked in order */
    enum { CB = 64 };
    int nb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int cb = 0; cb < nb; cb++) {
        int c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int n = 0; n < N; n++) {
            const float *d = dout + (size_t)n * C;
            if (tok[n] >= 0) {
                float *e = dwte + (size_t)tok[n] * C;
                for (int c = c0; c < c1; c++) e[c] += d[c];
            }
            if (dwpe) {
                float *p = dwpe + (size_t)pos[n] * C;
                for (int c = c0; c < c1; c++) p[c] += d[c];
            }
        }
    }
}

/* ---- normalisation ---- */

void cpu_norm_forward(kb_backend *b, bool rms, float *out, float *mean, float *rstd,
                      const float *in, const float *w, const float *bias, int N, int C,
                      float eps) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        const float *x = in + (size_t)n * C;
        float *o = out + (size_t)n * C;
        float mu = 0.0f;
        if (!rms) mu = row_sum(x, C) / (float)C;
        float acc[LANES] = {0};
        int i = 0;
        for (; i + LANES <= C; i += LANES)
            for (int l = 0; l < LANES; l++) {
                float d = x[i + l] - mu;
                acc[l] += d * d;
            }
        for (int l = 0; i < C; i++, l++) acc[l] += (x[i] - mu) * (x[i] - mu);
        float var = lane_sum(acc) / (float)C;
        float rs = 1.0f / sqrtf(var + eps);
        if (bias && !rms)
            for (int c = 0; c < C; c++) o[c] = (x[c] - mu) * rs * w[c] + bias[c];
        else
            for (int c = 0; c < C; c++) o[c] = (x[c] - mu) * rs * w[c];
        if (mean && !rms) mean[n] = mu;
        if (mean && rms) mean[n] = 0.0f;
        rstd[n] = rs;
    }
}

void cpu_norm_backward(kb_backend *b, bool rms, float *din, float *dw, float *dbias,
                       const float *dout, const float *in, const float *w,
                       const float *mean, const float *rstd, int N, int C) {
    cpu_state *st = cpu_st(b);
    if (rms) dbias = NULL;
    int P = st->threads < N ? st->threads : N;
    if (P < 1) return;
    size_t per = (size_t)C;
    float *part = NULL;
    if (dw || dbias) {
        part = cpu_scratch(st, CPU_SCR_MISC, 2 * (size_t)P * per * sizeof(float));
        if (!part) {
            b->status = co_err_set(CO_ENOMEM, "norm_backward: cannot allocate scratch");
            return;
        }
        memset(part, 0, 2 * (size_t)P * per * sizeof(float));
    }
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int p = 0; p < P; p++) {
        int n0 = (int)((int64_t)N * p / P), n1 = (int)((int64_t)N * (p + 1) / P);
        float *pw = part ? part + (size_t)p * per : NULL;
        float *pb = part ? part + ((size_t)P + p) * per : NULL;
        for (int n = n0; n < n1; n++) {
            const float *x = in + (size_t)n * C;
            const float *dy = dout + (size_t)n * C;
            float mu = rms ? 0.0f : mean[n];
            float rs = rstd[n];
            float a1[LANES] = {0}, a2[LANES] = {0};
            int i = 0;
            for (; i + LANES <= C; i += LANES)
                for (int l = 0; l < LANES; l++) {
                    float g = dy[i + l] * w[i + l];
                    a1[l] += g;
                    a2[l] += g * (x[i + l] - mu) * rs;
                }
            for (int l = 0; i < C; i++, l++) {
                float g = dy[i] * w[i];
                a1[l] += g;
                a2[l] += g * (x[i] - mu) * rs;
            }
            float mg = rms ? 0.0f : lane_sum(a1) / (float)C;
            float mgx = lane_sum(a2) / (float)C;
            if (din) {
                float *dx = din + (size_t)n * C;
                for (int c = 0; c < C; c++) {
                    float xh = (x[c] - mu) * rs;
                    dx[c] += rs * (dy[c] * w[c] - mg - xh * mgx);
                }
            }
            if (dw)
                for (int c = 0; c < C; c++) pw[c] += dy[c] * (x[c] - mu) * rs;
            if (dbias)
                for (int c = 0; c < C; c++) pb[c] += dy[c];
        }
    }
    if (!part) return;
    enum { CB = 256 };
    int nb = (C + CB - 1) / CB;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int cb = 0; cb < nb; cb++) {
        int c0 = cb * CB, c1 = c0 + CB < C ? c0 + CB : C;
        for (int p = 0; p < P; p++) {
            if (dw) {
                const float *pw = part + (size_t)p * per;
                for (int c = c0; c < c1; c++) dw[c] += pw[c];
            }
            if (dbias) {
                const float *pb = part + ((size_t)P + p) * per;
                for (int c = c0; c < c1; c++) dbias[c] += pb[c];
            }
        }
    }
}

/* ---- rotary embedding ---- */

static int rope_table(cpu_state *st, int npos, int hd, float base) {
    if (st->rope_cos && st->rope_hd == hd && st->rope_base == base && st->rope_npos >= npos)
        return 0;
    if (st->rope_hd == hd && st->rope_base == base && npos < 2 * st->rope_npos)
        npos = 2 * st->rope_npos;
    int half = hd / 2;
    free(st->rope_cos);
    free(st->rope_sin);
    st->rope_cos = malloc((size_t)npos * half * sizeof(float));
    st->rope_sin = malloc((size_t)npos * half * sizeof(float));
    if (!st->rope_cos || !st->rope_sin) {
        free(st->rope_cos);
        free(st->rope_sin);
        st->rope_cos = st->rope_sin = NULL;
        st->rope_npos = 0;
        return -1;
    }
    st->rope_npos = npos, st->rope_hd = hd, st->rope_base = base;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int p = 0; p < npos; p++)
        for (int i = 0; i < half; i++) {
            double inv = pow((double)base, -2.0 * i / hd);
            double a = (double)p * inv;
            st->rope_cos[(size_t)p * half + i] = (float)cos(a);
            st->rope_sin[(size_t)p * half + i] = (float)sin(a);
        }
    return 0;
}

void cpu_rope(kb_backend *b, float *qkv, const int32_t *pos, int N, int nh, int nkv, int hd,
              float base, bool inverse) {
    cpu_state *st = cpu_st(b);
    if (N <= 0 || hd < 2) return;
    int maxp = 0;
    for (int n = 0; n < N; n++) maxp = pos[n] > maxp ? pos[n] : maxp;
    if (rope_table(st, maxp + 1, hd, base)) {
        b->status = co_err_set(CO_ENOMEM, "rope: cannot allocate the angle table");
        return;
    }
    int half = hd / 2, row = (nh + 2 * nkv) * hd, heads = nh + nkv;
    float sg = inverse ? -1.0f : 1.0f;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        const float *cs = st->rope_cos + (size_t)pos[n] * half;
        const float *sn = st->rope_sin + (size_t)pos[n] * half;
        for (int h = 0; h < heads; h++) {
            float *x = qkv + (size_t)n * row + (size_t)h * hd;
            for (int i = 0; i < half; i++) {
                float x1 = x[i], x2 = x[i + half];
                float c = cs[i], s = sg * sn[i];
                x[i] = x1 * c - x2 * s;
                x[i + half] = x2 * c + x1 * s;
            }
        }
    }
}

/* ---- activations ---- */

#define GELU_K 0.7978845608028654f /* sqrt(2/pi) */
#define GELU_A 0.044715f

static inline float tanh_fast(float u) {
    /* 1 - 2/(exp(2u)+1): exact limits, absolute error ~1e-7 */
    return 1.0f - 2.0f / (cpu_expf(2.0f * u) + 1.0f);
}

void cpu_gelu_forward(kb_backend *b, float *out, const float *in, size_t n) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < NCHUNK(n); c++) {
        CHUNK_BOUNDS(c, n);
        for (size_t i = lo; i < hi; i++) {
            float x = in[i];
            float t = tanh_fast(GELU_K * (x + GELU_A * x * x * x));
            out[i] = 0.5f * x * (1.0f + t);
        }
    }
}

void cpu_gelu_backward(kb_backend *b, float *din, const float *dout, const float *in,
                       size_t n) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < NCHUNK(n); c++) {
        CHUNK_BOUNDS(c, n);
        for (size_t i = lo; i < hi; i++) {
            float x = in[i];
            float t = tanh_fast(GELU_K * (x + GELU_A * x * x * x));
            float dt = GELU_K * (1.0f + 3.0f * GELU_A * x * x);
            float g = 0.5f * (1.0f + t) + 0.5f * x * (1.0f - t * t) * dt;
            din[i] = dout[i] * g;
        }
    }
}

static inline float sigmoidf_fast(float a) { return 1.0f / (1.0f + cpu_expf(-a)); }

void cpu_swiglu_forward(kb_backend *b, float *out, const float *in, int N, int F) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        const float *a = in + (size_t)n * 2 * F, *g = a + F;
        float *o = out + (size_t)n * F;
        for (int i = 0; i < F; i++) o[i] = a[i] * sigmoidf_fast(a[i]) * g[i];
    }
}

void cpu_swiglu_backward(kb_backend *b, float *din, const float *dout, const float *in,
                         int N, int F) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        const float *a = in + (size_t)n * 2 * F, *g = a + F;
        const float *d = dout + (size_t)n * F;
        float *da = din + (size_t)n * 2 * F, *dg = da + F;
        for (int i = 0; i < F; i++) {
            float s = sigmoidf_fast(a[i]);
            float ai = a[i], gi = g[i], di = d[i];
            da[i] = di * gi * s * (1.0f + ai * (1.0f - s));
            dg[i] = di * ai * s;
        }
    }
}

/* ---- elementwise ---- */

void cpu_add(kb_backend *b, float *out, const float *x, const float *y, size_t n) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < NCHUNK(n); c++) {
        CHUNK_BOUNDS(c, n);
        for (size_t i = lo; i < hi; i++) out[i] = x[i] + y[i];
    }
}

void cpu_scale(kb_backend *b, float *x, float s, size_t n) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < NCHUNK(n); c++) {
        CHUNK_BOUNDS(c, n);
        for (size_t i = lo; i < hi; i++) x[i] *= s;
    }
}

void cpu_dropout(kb_backend *b, float *out, const float *in, size_t n, float p, uint64_t seed,
                 uint64_t offset) {
    cpu_state *st = cpu_st(b);
    if (p <= 0.0f) {
        if (out != in) memmove(out, in, n * sizeof(float));
        return;
    }
    float sc = p < 1.0f ? 1.0f / (1.0f - p) : 0.0f;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < NCHUNK(n); c++) {
        CHUNK_BOUNDS(c, n);
        for (size_t i = lo; i < hi; i++)
            out[i] = kb_keep(seed, offset + i, p) ? in[i] * sc : 0.0f;
    }
}

/* ---- loss ---- */

void cpu_cross_entropy(kb_backend *b, float *losses, float *logits, const int32_t *targets,
                       const float *dscale, int N, int Vp) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * Vp;
        float m = row_max(x, Vp);
        float acc[LANES] = {0};
        int i = 0;
        for (; i + LANES <= Vp; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += cpu_expf(x[i + l] - m);
        for (int l = 0; i < Vp; i++, l++) acc[l] += cpu_expf(x[i] - m);
        float lse = m + logf(lane_sum(acc));
        int tg = targets[n];
        bool valid = tg >= 0 && tg < Vp;
        losses[n] = valid ? lse - x[tg] : 0.0f;
        float ds = dscale ? dscale[n] : 1.0f;
        if (ds == 0.0f) {
            memset(x, 0, (size_t)Vp * sizeof(float));
            continue;
        }
        for (int j = 0; j < Vp; j++) x[j] = cpu_expf(x[j] - lse) * ds;
        if (valid) x[tg] -= ds;
    }
}

/* ---- vocabulary-parallel cross-entropy (backend.h: ce_max, ce_sums, ce_grad) ---- */

void cpu_ce_max(kb_backend *b, float *mx, const float *logits, int N, int V) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) mx[n] = row_max(logits + (size_t)n * V, V);
}

void cpu_ce_sums(kb_backend *b, float *sums, const float *logits, const float *mx, const int32_t *targets, int v0,
                 int N, int V) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        const float *x = logits + (size_t)n * V;
        float m = mx[n], acc[LANES] = {0};
        int i = 0;
        for (; i + LANES <= V; i += LANES)
            for (int l = 0; l < LANES; l++) acc[l] += cpu_expf(x[i + l] - m);
        for (int l = 0; i < V; i++, l++) acc[l] += cpu_expf(x[i] - m);
        sums[n] = lane_sum(acc);
        int t = targets[n] - v0;
        sums[N + n] = t >= 0 && t < V ? x[t] - m : 0.0f;
    }
}

void cpu_ce_grad(kb_backend *b, float *losses, float *logits, const float *mx, const float *sums,
                 const int32_t *targets, const float *dscale, int v0, int Vt, int N, int V) {
    cpu_state *st = cpu_st(b);
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int n = 0; n < N; n++) {
        float *x = logits + (size_t)n * V;
        float lse = logf(sums[n]);
        int tg = targets[n];
        losses[n] = tg >= 0 && tg < Vt ? lse - sums[N + n] : 0.0f;
        float ds = dscale ? dscale[n] : 1.0f;
        if (ds == 0.0f) {
            memset(x, 0, (size_t)V * sizeof(float));
            continue;
        }
        float off = mx[n] + lse;
        for (int j = 0; j < V; j++) x[j] = cpu_expf(x[j] - off) * ds;
        int t = tg - v0;
        if (tg >= 0 && tg < Vt && t >= 0 && t < V) x[t] -= ds;
    }
}

/* ---- optimizer ---- */

#define SUMSQ_CHUNK ((size_t)8192)

double cpu_sumsq(kb_backend *b, const float *x, size_t n) {
    cpu_state *st = cpu_st(b);
    size_t nc = (n + SUMSQ_CHUNK - 1) / SUMSQ_CHUNK;
    if (nc == 0) return 0.0;
    double *part = cpu_scratch(st, CPU_SCR_MISC, nc * sizeof(double));
    if (!part) {
        b->status = co_err_set(CO_ENOMEM, "sumsq: cannot allocate scratch");
        return NAN;
    }
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (size_t c = 0; c < nc; c++) {
        size_t lo = c * SUMSQ_CHUNK, hi = lo + SUMSQ_CHUNK < n ? lo + SUMSQ_CHUNK : n;
        double acc[8] = {0};
        size_t i = lo;
        for (; i + 8 <= hi; i += 8)
            for (int l = 0; l < 8; l++) acc[l] += (double)x[i + l] * (double)x[i + l];
        for (int l = 0; i < hi; i++, l++) acc[l] += (double)x[i] * (double)x[i];
        part[c] = ((acc[0] + acc[4]) + (acc[2] + acc[6])) + ((acc[1] + acc[5]) + (acc[3] + acc[7]));
    }
    double s = 0.0;
    for (size_t c = 0; c < nc; c++) s += part[c];
    return s;
}

/* One chunk of AdamW (p, g, m, v at the chunk's start, n elements). */
static inline void adamw_chunk(float *p, const float *g, float *m, float *v, size_t n, float lr, float beta1,
                               float beta2, float c1, float c2, float ib1, float ib2, float eps, float wd,
                               float gscale) {
    for (size_t i = 0; i < n; i++) {
        float gi = g[i] * gscale;
        float mi = beta1 * m[i] + c1 * gi;
        float vi = beta2 * v[i] + c2 * gi * gi;
        m[i] = mi;
        v[i] = vi;
        float mh = mi * ib1, vh = vi * ib2;
        p[i] -= lr * (mh / (sqrtf(vh) + eps) + wd * p[i]);
    }
}

void cpu_adamw_checksum(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n, float lr,
                        float beta1, float beta2, float eps, float wd, float gscale, int64_t t, uint64_t seed,
                        uint64_t *sum) {
    cpu_state *st = cpu_st(b);
    if (t < 1) t = 1;
    float ib1 = (float)(1.0 / (1.0 - pow((double)beta1, (double)t)));
    float ib2 = (float)(1.0 / (1.0 - pow((double)beta2, (double)t)));
    float c1 = 1.0f - beta1, c2 = 1.0f - beta2;
    uint64_t h = 0;
#pragma omp parallel for schedule(static) num_threads(st->threads) reduction(^ : h)
    for (size_t c = 0; c < NCHUNK(n); c++) {
        CHUNK_BOUNDS(c, n);
        adamw_chunk(p + lo, g + lo, m + lo, v + lo, hi - lo, lr, beta1, beta2, c1, c2, ib1, ib2, eps, wd, gscale);
        if (sum) h ^= kb_checksum_block(p + lo, hi - lo, seed, c);
    }
    if (sum) *sum = h;
}

void cpu_adamw(kb_backend *b, float *p, const float *g, float *m, float *v, size_t n, float lr,
               float beta1, float beta2, float eps, float wd, float gscale, int64_t t) {
    cpu_adamw_checksum(b, p, g, m, v, n, lr, beta1, beta2, eps, wd, gscale, t, 0, NULL);
}
