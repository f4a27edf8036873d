/* block_attention.c - attention of a query block against a key/value block on the CPU, the
 * building block of ring attention (model/ring_attention.c, docs/context-parallel.md).
 *
 * Unlike attention.c the query and key sets may differ (a rank's chunks against a chunk
 * received from another rank), so the mask is a mode (none, or causal for the same token
 * set) plus optional per-token document ids. Shapes and layout: kb_block_attn in
 * kernels/backend.h.
 *
 * A straightforward implementation in plain C, compiled once without instruction-set flags
 * (so it runs on AVX2-only and AVX-512 CPUs alike):
 *   forward:  one item per query row (b, h, t): scores against every visible key, max, sum,
 *             out = sum_j p_j v_j, lse = max + log(sum).
 *   backward: D[b,h,t] = dout . out (the final, merged out), then
 *             dq:     one item per (b, h, t), walking keys j;
 *             dk, dv: one item per key (b, g, j), walking the group's heads, then queries;
 *             both rebuild P = exp(S - lse) from the final lse.
 * Every item is sequential inside and owns its outputs, so results are bitwise independent
 * of the thread count (OpenMP static schedules over items). */
#include <math.h>
#include <omp.h>
#include <stdlib.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

/* checks the geometry; sets b->status and returns false when it cannot run */
static bool blk_valid(kb_backend *b, const kb_block_attn *a, const char *op) {
    const char *why = NULL;
    if (a->B < 0 || a->Tq < 0 || a->Tk < 0 || a->nh <= 0 || a->nkv <= 0 || a->hd <= 0)
        why = "bad sizes";
    else if (a->nh % a->nkv)
        why = "nh is not a multiple of nkv";
    else if (a->mask == KB_BLOCK_MASK_CAUSAL && a->Tq != a->Tk)
        why = "the causal mask needs Tq == Tk";
    else if (a->mask != KB_BLOCK_MASK_NONE && a->mask != KB_BLOCK_MASK_CAUSAL)
        why = "unknown mask mode";
    else if (!a->qdoc != !a->kdoc)
        why = "qdoc and kdoc must both be set or both be NULL";
    else if ((a->q_brows && a->q_brows < a->Tq) || (a->k_brows && a->k_brows < a->Tk))
        why = "rows per sequence smaller than the block";
    if (!why) return true;
    b->status = co_err_set(CO_EINVAL, "%s: %s", op, why);
    return false;
}

/* the last key (exclusive) query t may see, before document masks */
static inline int blk_khi(const kb_block_attn *a, int t) {
    return a->mask == KB_BLOCK_MASK_CAUSAL ? t + 1 : a->Tk;
}

static inline bool blk_doc_ok(const kb_block_attn *a, int b, int t, int j, int qbr, int kbr) {
    return !a->qdoc || a->qdoc[(size_t)b * qbr + t] == a->kdoc[(size_t)b * kbr + j];
}

static inline float blk_dot(const float *x, const float *y, int n) {
    float s = 0.0f;
    for (int i = 0; i < n; i++) s += x[i] * y[i];
    return s;
}

void cpu_block_attention_forward(kb_backend *b, const kb_block_attn *a, float *out, float *lse) {
    cpu_state *st = cpu_st(b);
    if (!blk_valid(b, a, "block_attention_forward")) return;
    const int B = a->B, Tq = a->Tq, Tk = a->Tk, nh = a->nh, hd = a->hd, rep = nh / a->nkv;
    const int qbr = a->q_brows ? a->q_brows : Tq, kbr = a->k_brows ? a->k_brows : Tk;
    const float scale = 1.0f / sqrtf((float)hd);
    const long items = (long)B * nh * Tq;
    if (items == 0) return;
    /* per thread: scores s[Tk] */
    const size_t per = (size_t)(Tk > 0 ? Tk : 1);
    float *scr = malloc((size_t)st->threads * per * sizeof(float));
    if (!scr) {
        b->status = co_err_set(CO_ENOMEM, "block_attention_forward: cannot allocate scratch");
        return;
    }
#pragma omp parallel num_threads(st->threads)
    {
        float *s = scr + (size_t)omp_get_thread_num() * per;
#pragma omp for schedule(static)
        for (long it = 0; it < items; it++) {
            /* item order (b, h, t) */
            const int t = (int)(it % Tq), h = (int)((it / Tq) % nh), bb = (int)(it / Tq / nh);
            const int g = h / rep;
            const float *q = a->q + ((size_t)bb * qbr + t) * a->q_stride + (size_t)h * hd;
            float *o = out + ((size_t)bb * Tq + t) * nh * hd + (size_t)h * hd;
            float *l = lse + ((size_t)bb * nh + h) * Tq + t;
            const int khi = blk_khi(a, t);
            float m = -INFINITY;
            for (int j = 0; j < khi; j++) {
                if (!blk_doc_ok(a, bb, t, j, qbr, kbr)) {
                    s[j] = -INFINITY;
                    continue;
                }
                const float *k = a->k + ((size_t)bb * kbr + j) * a->k_stride + (size_t)g * hd;
                s[j] = blk_dot(q, k, hd) * scale;
                m = s[j] > m ? s[j] : m;
            }
            for (int c = 0; c < hd; c++) o[c] = 0.0f;
            if (m == -INFINITY) { /* no visible key */
                *l = -INFINITY;
                continue;
            }
            float z = 0.0f;
            for (int j = 0; j < khi; j++) {
                if (s[j] == -INFINITY) continue;
                const float w = expf(s[j] - m);
                z += w;
                const float *v = a->v + ((size_t)bb * kbr + j) * a->v_stride + (size_t)g * hd;
                for (int c = 0; c < hd; c++) o[c] += w * v[c];
            }
            const float iz = 1.0f / z;
            for (int c = 0; c < hd; c++) o[c] *= iz;
            *l = m + logf(z);
        }
    }
    free(scr);
}

void cpu_block_attention_backward(kb_backend *b, const kb_block_attn *a, const float *out,
                                  const float *lse, const float *dout, float *dq,
                                  size_t dq_stride, float *dk, size_t dk_stride, float *dv,
                                  size_t dv_stride) {
    cpu_state *st = cpu_st(b);
    if (!blk_valid(b, a, "block_attention_backward")) return;
    const int B = a->B, Tq = a->Tq, Tk = a->Tk, nh = a->nh, nkv = a->nkv, hd = a->hd;
    const int rep = nh / nkv;
    const int qbr = a->q_brows ? a->q_brows : Tq, kbr = a->k_brows ? a->k_brows : Tk;
    const float scale = 1.0f / sqrtf((float)hd);
    const long nrows = (long)B * nh * Tq;
    if (nrows == 0 || Tk == 0) return;
    /* D[(b*nh + h)*Tq + t] = dout . out over the row's head, then per-thread dk/dv rows */
    float *D = malloc((size_t)nrows * sizeof(float));
    float *scr = malloc((size_t)st->threads * 2 * hd * sizeof(float));
    if (!D || !scr) {
        free(D);
        free(scr);
        b->status = co_err_set(CO_ENOMEM, "block_attention_backward: cannot allocate scratch");
        return;
    }
#pragma omp parallel num_threads(st->threads)
    {
#pragma omp for schedule(static)
        for (long it = 0; it < nrows; it++) {
            const int t = (int)(it % Tq), h = (int)((it / Tq) % nh), bb = (int)(it / Tq / nh);
            const size_t oi = ((size_t)bb * Tq + t) * nh * hd + (size_t)h * hd;
            D[it] = blk_dot(dout + oi, out + oi, hd);
        }
        /* dq: item (b, h, t) */
#pragma omp for schedule(static)
        for (long it = 0; it < nrows; it++) {
            const float L = lse[it];
            if (L == -INFINITY) continue; /* the row saw no key anywhere */
            const int t = (int)(it % Tq), h = (int)((it / Tq) % nh), bb = (int)(it / Tq / nh);
            const int g = h / rep;
            const float *q = a->q + ((size_t)bb * qbr + t) * a->q_stride + (size_t)h * hd;
            const float *go = dout + ((size_t)bb * Tq + t) * nh * hd + (size_t)h * hd;
            float *gq = dq + ((size_t)bb * qbr + t) * dq_stride + (size_t)h * hd;
            const int khi = blk_khi(a, t);
            for (int j = 0; j < khi; j++) {
                if (!blk_doc_ok(a, bb, t, j, qbr, kbr)) continue;
                const float *k = a->k + ((size_t)bb * kbr + j) * a->k_stride + (size_t)g * hd;
                const float *v = a->v + ((size_t)bb * kbr + j) * a->v_stride + (size_t)g * hd;
                const float p = expf(blk_dot(q, k, hd) * scale - L);
                const float ds = p * (blk_dot(go, v, hd) - D[it]) * scale;
                for (int c = 0; c < hd; c++) gq[c] += ds * k[c];
            }
        }
        /* dk, dv: item (b, g, j), heads of the group in order, then queries */
        float *ak = scr + (size_t)omp_get_thread_num() * 2 * hd, *av = ak + hd;
        const long nkeys = (long)B * nkv * Tk;
#pragma omp for schedule(static)
        for (long it = 0; it < nkeys; it++) {
            const int j = (int)(it % Tk), g = (int)((it / Tk) % nkv), bb = (int)(it / Tk / nkv);
            const float *k = a->k + ((size_t)bb * kbr + j) * a->k_stride + (size_t)g * hd;
            const float *v = a->v + ((size_t)bb * kbr + j) * a->v_stride + (size_t)g * hd;
            for (int c = 0; c < hd; c++) ak[c] = av[c] = 0.0f;
            const int t0 = a->mask == KB_BLOCK_MASK_CAUSAL ? j : 0;
            for (int h = g * rep; h < (g + 1) * rep; h++)
                for (int t = t0; t < Tq; t++) {
                    const size_t ri = ((size_t)bb * nh + h) * Tq + t;
                    const float L = lse[ri];
                    if (L == -INFINITY || !blk_doc_ok(a, bb, t, j, qbr, kbr)) continue;
                    const float *q = a->q + ((size_t)bb * qbr + t) * a->q_stride + (size_t)h * hd;
                    const float *go = dout + ((size_t)bb * Tq + t) * nh * hd + (size_t)h * hd;
                    const float p = expf(blk_dot(q, k, hd) * scale - L);
                    const float ds = p * (blk_dot(go, v, hd) - D[ri]) * scale;
                    for (int c = 0; c < hd; c++) {
                        av[c] += p * go[c];
                        ak[c] += ds * q[c];
                    }
                }
            float *gk = dk + ((size_t)bb * kbr + j) * dk_stride + (size_t)g * hd;
            float *gv = dv + ((size_t)bb * kbr + j) * dv_stride + (size_t)g * hd;
            for (int c = 0; c < hd; c++) {
                gk[c] += ak[c];
                gv[c] += av[c];
            }
        }
    }
    free(D);
    free(scr);
}
