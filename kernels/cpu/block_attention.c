/* block_attention.c - attention of a query block against a key/value block on the CPU, the
 * building block of ring attention (model/ring_attention.c, docs/context-parallel.md).
 *
 * Unlike the one-rank kernel (attention.c) the query and key sets may differ (a rank's chunks
 * against a chunk received from another rank), so the mask is a mode (none, or causal for the
 * same token set) plus optional per-token document ids. Shapes and layout: kb_block_attn in
 * kernels/backend.h.
 *
 * The same flash-attention tiling as attention.c, with its register-blocked micro kernels
 * (attn_tiles.h), and compiled like it once per instruction set (kernels/meson.build; the
 * unsuffixed entry points in cpu_backend.c choose the variant at run time):
 *   forward:  one item per (b, query head h, block of BQ queries): key blocks of BK, online
 *             softmax, out = O / L, lse = max + log(L); keys another document holds get
 *             score -inf; a row that sees no key gets out = 0, lse = -inf.
 *   backward: D = dout . out (the final, merged out); one item per (b, h) walks the key
 *             blocks and for each the query blocks that can see it, rebuilding P = exp(S -
 *             lse) from the final lse, accumulating dQ in place (the item owns its head's
 *             rows) and dK, dV of the head into scratch; afterwards the heads of each group are
 *             summed in head order and ADDED into dk, dv.
 * Everything inside an item is sequential, so results are bitwise independent of the thread
 * count (OpenMP static schedules over items). */
#include <omp.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/cpu/cpu.h"

#include "kernels/cpu/attn_tiles.h"

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

typedef struct blk_geo {
    const kb_block_attn *a;
    int qbr, kbr, rep;
    bool causal;
    float scale;
} blk_geo;

static void blk_geo_init(blk_geo *g, const kb_block_attn *a) {
    g->a = a;
    g->qbr = a->q_brows ? a->q_brows : a->Tq;
    g->kbr = a->k_brows ? a->k_brows : a->Tk;
    g->rep = a->nh / a->nkv;
    g->causal = a->mask == KB_BLOCK_MASK_CAUSAL;
    g->scale = 1.0f / sqrtf((float)a->hd);
}

/* the keys [0, hi) of block j0 (nk keys) query t may see before document masks */
static inline int blk_hi(const blk_geo *g, int t, int j0, int nk) {
    if (!g->causal) return nk;
    const int hi = t + 1 - j0;
    return hi < nk ? hi : nk;
}

/* K (and V) rows [j0, j0+nk) of group row base kb (row stride ks) transposed into Kt[hd][BK],
 * zero beyond nk */
static inline void blk_load_t(float *Kt, const float *kb, size_t ks, int j0, int nk, int hd) {
    for (int jj = 0; jj < nk; jj++) {
        const float *k = kb + (size_t)(j0 + jj) * ks;
        for (int d = 0; d < hd; d++) Kt[(size_t)d * BK + jj] = k[d];
    }
    for (int jj = nk; jj < BK; jj++)
        for (int d = 0; d < hd; d++) Kt[(size_t)d * BK + jj] = 0.0f;
}

static size_t bfwd_scratch_floats(int hd) {
    return (size_t)hd * BK + (size_t)BQ * BK + 2 * (size_t)BQ * hd + 2 * BQ + 64;
}

AI void bfwd_item(const blk_geo *g, float *out, float *lse, int b, int h, int qb, float *scr, const int hd) {
    const kb_block_attn *a = g->a;
    const int Tq = a->Tq, nh = a->nh, t0 = qb * BQ, t1 = t0 + BQ < Tq ? t0 + BQ : Tq, nq = t1 - t0;
    const int grp = h / g->rep;
    const float *qbase = a->q + (size_t)b * g->qbr * a->q_stride + (size_t)h * hd;
    const float *kbase = a->k + (size_t)b * g->kbr * a->k_stride + (size_t)grp * hd;
    const float *vbase = a->v + (size_t)b * g->kbr * a->v_stride + (size_t)grp * hd;
    const int32_t *qd = a->qdoc ? a->qdoc + (size_t)b * g->qbr : NULL;
    const int32_t *kd = a->kdoc ? a->kdoc + (size_t)b * g->kbr : NULL;
    float *Kt = scr;                 /* [hd][BK] */
    float *S = Kt + (size_t)hd * BK; /* [BQ][BK] */
    float *Q = S + (size_t)BQ * BK;  /* [BQ][hd] scaled */
    float *O = Q + (size_t)BQ * hd;  /* [BQ][hd] */
    float *M = O + (size_t)BQ * hd, *L = M + BQ;
    int nkr[BQ];
    for (int i = 0; i < nq; i++) {
        const float *q = qbase + (size_t)(t0 + i) * a->q_stride;
        for (int d = 0; d < hd; d++) Q[(size_t)i * hd + d] = q[d] * g->scale;
        for (int d = 0; d < hd; d++) O[(size_t)i * hd + d] = 0.0f;
        M[i] = -INFINITY;
        L[i] = 0.0f;
    }
    const int jend = g->causal ? t1 : a->Tk;
    for (int j0 = 0; j0 < jend; j0 += BK) {
        const int nk = j0 + BK < jend ? BK : jend - j0;
        blk_load_t(Kt, kbase, a->k_stride, j0, nk, hd);
        mk_a_rows(S, Q, (size_t)hd, Kt, hd, nq);
        for (int i = 0; i < nq; i++) {
            const int t = t0 + i, hi = blk_hi(g, t, j0, nk);
            float *s = S + (size_t)i * BK;
            nkr[i] = 0;
            if (hi <= 0) continue;
            if (qd) {
                const int32_t me = qd[t];
                for (int jj = 0; jj < hi; jj++)
                    if (kd[j0 + jj] != me) s[jj] = -INFINITY;
            }
            const float mb = row_max(s, 0, hi);
            if (mb == -INFINITY) continue; /* every key of the block masked */
            const float mnew = mb > M[i] ? mb : M[i];
            const float alpha = cpu_expf(M[i] - mnew);
            float ls[16];
            for (int l = 0; l < 16; l++) ls[l] = 0.0f;
            for (int j = 0; j < BK; j += 16)
                for (int l = 0; l < 16; l++) {
                    const int jj = j + l;
                    const float p = (jj < hi && s[jj] > -INFINITY) ? cpu_expf(s[jj] - mnew) : 0.0f;
                    s[jj] = p;
                    ls[l] += p;
                }
            float psum = 0.0f;
            for (int l = 0; l < 16; l++) psum += ls[l];
            L[i] = L[i] * alpha + psum;
            M[i] = mnew;
            float *o = O + (size_t)i * hd;
            if (alpha != 1.0f)
                for (int d = 0; d < hd; d++) o[d] *= alpha;
            nkr[i] = hi;
        }
        mk_b_rows(O, (size_t)hd, S, BK, vbase + (size_t)j0 * a->v_stride, a->v_stride, nkr, hd, nq);
    }
    const size_t nhd = (size_t)nh * hd;
    for (int i = 0; i < nq; i++) {
        const int t = t0 + i;
        float *o = out + ((size_t)b * Tq + t) * nhd + (size_t)h * hd;
        float *l = lse + ((size_t)b * nh + h) * Tq + t;
        if (L[i] == 0.0f) { /* no visible key */
            for (int d = 0; d < hd; d++) o[d] = 0.0f;
            *l = -INFINITY;
            continue;
        }
        const float inv = 1.0f / L[i];
        for (int d = 0; d < hd; d++) o[d] = O[(size_t)i * hd + d] * inv;
        *l = M[i] + logf(L[i]);
    }
}

static void bfwd_item_any(const blk_geo *g, float *out, float *lse, int b, int h, int qb, float *scr) {
    switch (g->a->hd) {
    case 64: bfwd_item(g, out, lse, b, h, qb, scr, 64); break;
    case 128: bfwd_item(g, out, lse, b, h, qb, scr, 128); break;
    default: bfwd_item(g, out, lse, b, h, qb, scr, g->a->hd); break;
    }
}

void ATTN_FN(cpu_block_attention_forward)(kb_backend *b, const kb_block_attn *a, float *out, float *lse) {
    cpu_state *st = cpu_st(b);
    if (!blk_valid(b, a, "block_attention_forward")) return;
    if (a->B == 0 || a->Tq == 0) return;
    blk_geo g;
    blk_geo_init(&g, a);
    const size_t per = bfwd_scratch_floats(a->hd);
    float *scr = cpu_scratch(st, CPU_SCR_ATTN, (size_t)st->threads * per * sizeof(float));
    if (!scr) {
        b->status = co_err_set(CO_ENOMEM, "block_attention_forward: cannot allocate scratch");
        return;
    }
    const int nqb = (a->Tq + BQ - 1) / BQ, nh = a->nh, items = a->B * nh * nqb;
#pragma omp parallel num_threads(st->threads)
    {
        float *my = scr + (size_t)omp_get_thread_num() * per;
#pragma omp for schedule(static, 1)
        for (int it = 0; it < items; it++) {
            const int qb = it % nqb, bh = it / nqb;
            bfwd_item_any(&g, out, lse, bh / nh, bh % nh, qb, my);
        }
    }
}

/* ---- backward ---- */

static size_t bbwd_scratch_floats(int hd, int Tq) {
    return 2 * (size_t)hd * BK + 4 * (size_t)BQ * BK + 2 * (size_t)BK * hd + (size_t)Tq + 64;
}

typedef struct blk_bwd {
    const float *out, *lse, *dout;
    float *dq;
    size_t dq_stride;
    float *dkh, *dvh; /* [B][nh][Tk][hd] */
} blk_bwd;

AI void bbwd_item(const blk_geo *g, const blk_bwd *w, int b, int h, float *scr, const int hd) {
    const kb_block_attn *a = g->a;
    const int Tq = a->Tq, Tk = a->Tk, nh = a->nh, grp = h / g->rep;
    const size_t nhd = (size_t)nh * hd, qs = a->q_stride;
    const float scale = g->scale;
    const float *qbase = a->q + (size_t)b * g->qbr * qs + (size_t)h * hd;
    const float *kbase = a->k + (size_t)b * g->kbr * a->k_stride + (size_t)grp * hd;
    const float *vbase = a->v + (size_t)b * g->kbr * a->v_stride + (size_t)grp * hd;
    float *dqbase = w->dq + (size_t)b * g->qbr * w->dq_stride + (size_t)h * hd;
    const float *obase = w->out + (size_t)b * Tq * nhd + (size_t)h * hd;
    const float *dobase = w->dout + (size_t)b * Tq * nhd + (size_t)h * hd;
    const float *lrow = w->lse + ((size_t)b * nh + h) * Tq;
    const int32_t *qd = a->qdoc ? a->qdoc + (size_t)b * g->qbr : NULL;
    const int32_t *kd = a->kdoc ? a->kdoc + (size_t)b * g->kbr : NULL;
    float *dk = w->dkh + ((size_t)b * nh + h) * Tk * hd; /* [Tk][hd] */
    float *dv = w->dvh + ((size_t)b * nh + h) * Tk * hd;

    float *Kt = scr;                    /* [hd][BK] */
    float *Vt = Kt + (size_t)hd * BK;   /* [hd][BK] */
    float *P = Vt + (size_t)hd * BK;    /* [BQ][BK] */
    float *dS = P + (size_t)BQ * BK;    /* [BQ][BK] dP, then dS * scale */
    float *PT = dS + (size_t)BQ * BK;   /* [BK][BQ] */
    float *dST = PT + (size_t)BQ * BK;  /* [BK][BQ] */
    float *dKj = dST + (size_t)BQ * BK; /* [BK][hd] */
    float *dVj = dKj + (size_t)BK * hd; /* [BK][hd] */
    float *D = dVj + (size_t)BK * hd;   /* [Tq] */
    int nkr[BQ], nqr[BK];

    for (int t = 0; t < Tq; t++) {
        const float *o = obase + (size_t)t * nhd, *d_o = dobase + (size_t)t * nhd;
        float acc[16] = {0};
        int d = 0;
        for (; d + 16 <= hd; d += 16)
            for (int l = 0; l < 16; l++) acc[l] += o[d + l] * d_o[d + l];
        for (int l = 0; d < hd; d++, l++) acc[l] += o[d] * d_o[d];
        float s = 0.0f;
        for (int l = 0; l < 16; l++) s += acc[l];
        D[t] = s;
    }
    for (int j0 = 0; j0 < Tk; j0 += BK) {
        const int nk = j0 + BK < Tk ? BK : Tk - j0;
        blk_load_t(Kt, kbase, a->k_stride, j0, nk, hd);
        blk_load_t(Vt, vbase, a->v_stride, j0, nk, hd);
        memset(dKj, 0, (size_t)BK * hd * sizeof(float));
        memset(dVj, 0, (size_t)BK * hd * sizeof(float));
        for (int t0 = g->causal ? (j0 / BQ) * BQ : 0; t0 < Tq; t0 += BQ) {
            const int nq = t0 + BQ < Tq ? BQ : Tq - t0;
            const float *qblk = qbase + (size_t)t0 * qs, *doblk = dobase + (size_t)t0 * nhd;
            mk_a_rows(P, qblk, qs, Kt, hd, nq);
            mk_a_rows(dS, doblk, nhd, Vt, hd, nq);
            bool any = false;
            for (int i = 0; i < nq; i++) {
                const int t = t0 + i, hi = blk_hi(g, t, j0, nk);
                float *p = P + (size_t)i * BK, *dp = dS + (size_t)i * BK;
                const float l = lrow[t], Dt = D[t];
                if (hi <= 0 || l == -INFINITY) {
                    for (int jj = 0; jj < BK; jj++) p[jj] = dp[jj] = 0.0f;
                    nkr[i] = 0;
                    continue;
                }
                any = true;
                nkr[i] = hi;
                if (qd) {
                    const int32_t me = qd[t];
                    for (int jj = 0; jj < hi; jj++)
                        if (kd[j0 + jj] != me) p[jj] = -INFINITY;
                }
                for (int jj = 0; jj < BK; jj++) {
                    const bool in = jj < hi && p[jj] > -INFINITY;
                    const float pr = in ? cpu_expf(p[jj] * scale - l) : 0.0f;
                    dp[jj] = pr * (dp[jj] - Dt) * scale;
                    p[jj] = pr;
                }
            }
            if (!any) continue;
            for (int i = 0; i < nq; i++)
                for (int jj = 0; jj < BK; jj++) {
                    PT[(size_t)jj * BQ + i] = P[(size_t)i * BK + jj];
                    dST[(size_t)jj * BQ + i] = dS[(size_t)i * BK + jj];
                }
            for (int jj = 0; jj < BK; jj++) nqr[jj] = jj < nk ? nq : 0;
            mk_b_rows(dVj, (size_t)hd, PT, BQ, doblk, nhd, nqr, hd, nk);
            mk_b_rows(dKj, (size_t)hd, dST, BQ, qblk, qs, nqr, hd, nk);
            mk_b_rows(dqbase + (size_t)t0 * w->dq_stride, w->dq_stride, dS, BK, kbase + (size_t)j0 * a->k_stride,
                      a->k_stride, nkr, hd, nq);
        }
        for (int jj = 0; jj < nk; jj++) {
            memcpy(dk + (size_t)(j0 + jj) * hd, dKj + (size_t)jj * hd, (size_t)hd * sizeof(float));
            memcpy(dv + (size_t)(j0 + jj) * hd, dVj + (size_t)jj * hd, (size_t)hd * sizeof(float));
        }
    }
}

static void bbwd_item_any(const blk_geo *g, const blk_bwd *w, int b, int h, float *scr) {
    switch (g->a->hd) {
    case 64: bbwd_item(g, w, b, h, scr, 64); break;
    case 128: bbwd_item(g, w, b, h, scr, 128); break;
    default: bbwd_item(g, w, b, h, scr, g->a->hd); break;
    }
}

void ATTN_FN(cpu_block_attention_backward)(kb_backend *b, const kb_block_attn *a, const float *out,
                                           const float *lse, const float *dout, float *dq, size_t dq_stride,
                                           float *dk, size_t dk_stride, float *dv, size_t dv_stride) {
    cpu_state *st = cpu_st(b);
    if (!blk_valid(b, a, "block_attention_backward")) return;
    const int B = a->B, Tq = a->Tq, Tk = a->Tk, nh = a->nh, nkv = a->nkv, hd = a->hd;
    if (B == 0 || Tq == 0 || Tk == 0) return;
    blk_geo g;
    blk_geo_init(&g, a);
    const size_t per = bbwd_scratch_floats(hd, Tq);
    float *scr = cpu_scratch(st, CPU_SCR_ATTN, (size_t)st->threads * per * sizeof(float));
    const size_t headsz = (size_t)B * nh * Tk * hd;
    float *dkh = cpu_scratch(st, CPU_SCR_MISC, 2 * headsz * sizeof(float));
    if (!scr || !dkh) {
        b->status = co_err_set(CO_ENOMEM, "block_attention_backward: cannot allocate scratch");
        return;
    }
    blk_bwd w = {out, lse, dout, dq, dq_stride, dkh, dkh + headsz};
    const int items = B * nh;
#pragma omp parallel num_threads(st->threads)
    {
        float *my = scr + (size_t)omp_get_thread_num() * per;
#pragma omp for schedule(static, 1)
        for (int it = 0; it < items; it++) bbwd_item_any(&g, &w, it / nh, it % nh, my);
    }
    /* the heads of each group summed in head order, then added into dk, dv */
    const int rep = g.rep, kbr = g.kbr;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int bt = 0; bt < B * Tk; bt++) {
        const int bb = bt / Tk, j = bt % Tk;
        for (int kv = 0; kv < 2; kv++) {
            const float *src = kv ? w.dvh : w.dkh;
            float *dst0 = kv ? dv : dk;
            const size_t ds = kv ? dv_stride : dk_stride;
            for (int gg = 0; gg < nkv; gg++) {
                float *dst = dst0 + ((size_t)bb * kbr + j) * ds + (size_t)gg * hd;
                const float *s0 = src + (((size_t)bb * nh + (size_t)gg * rep) * Tk + j) * hd;
                for (int d = 0; d < hd; d++) {
                    float acc = s0[d];
                    for (int r = 1; r < rep; r++) acc += src[(((size_t)bb * nh + (size_t)gg * rep + r) * Tk + j) * hd + d];
                    dst[d] += acc;
                }
            }
        }
    }
}
