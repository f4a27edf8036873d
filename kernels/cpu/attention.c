/* attention.c - causal grouped-query attention, flash-attention style, on the CPU.
 *
 * Forward: one work item per (sequence b, query head h, block of BQ queries). Keys are
 * visited in blocks of BK from the first block the block's seg[] lower bounds allow up to
 * the diagonal; scores above the diagonal are never computed. Online softmax keeps a
 * running max and sum per row; the saved lse[(b*nh + h)*T + t] lets backward rebuild P.
 *
 * Backward: one work item per (b, h). It walks key blocks, and for each the query blocks
 * that can see it, rebuilding P from lse, accumulating dV and dK of the key block locally
 * and dQ in place (the item owns its query head). dK/dV per query head land in a scratch
 * buffer and are summed over the heads of each GQA group in a fixed order afterwards.
 *
 * Dropout: the probability P[b,h,t,j] is kept iff kb_keep(seed, offset + idx, p) with
 * idx = ((b*nh + h)*T + t)*T + j, and scaled by 1/(1-p); lse is the undropped softmax.
 *
 * Inner loops run over a fixed block width (BK keys, or hd channels) with no reductions
 * across lanes, so the compiler vectorises them; everything inside an item is sequential,
 * so the results are bitwise independent of the thread count.
 *
 * This file is compiled once per instruction set (kernels/meson.build: -DCPU_ATTN_VARIANT=
 * avx512, avx2 or base, each with its -m flags), and cpu_attention_forward/backward pick
 * the variant for cpu_isa_level() at run time, so one binary is fast on AVX-512 and on
 * AVX2-only CPUs and ONEDNN_MAX_CPU_ISA=AVX2 runs the AVX2 kernels here. Every variant
 * accumulates each lane in the same order with fused multiply-adds. */
#include <omp.h>
#include <stdlib.h>

#include "kernels/cpu/cpu.h"
#include "common/error.h"

#include "kernels/cpu/attn_tiles.h"

typedef struct attn_geo {
    int B, T, nh, nkv, hd, rep;
    size_t R; /* row stride of qkv */
    float scale, p_drop, inv_keep;
    uint64_t seed, offset;
    const int32_t *seg;
} attn_geo;

static size_t fwd_scratch_floats(int hd) {
    return (size_t)hd * BK + (size_t)BQ * BK + 2 * (size_t)BQ * hd + 2 * BQ + 64;
}

AI void fwd_item(const attn_geo *g, float *out, float *lse, const float *qkv, int b, int h,
                 int qb, float *scr, const int hd) {
    const int T = g->T, t0 = qb * BQ, t1 = t0 + BQ < T ? t0 + BQ : T, nq = t1 - t0;
    const int grp = h / g->rep;
    const size_t R = g->R;
    const float *qbase = qkv + (size_t)b * T * R + (size_t)h * hd;
    const float *kbase = qkv + (size_t)b * T * R + (size_t)(g->nh + grp) * hd;
    const float *vbase = qkv + (size_t)b * T * R + (size_t)(g->nh + g->nkv + grp) * hd;
    const int32_t *seg = g->seg ? g->seg + (size_t)b * T : NULL;
    float *Kt = scr;                       /* [hd][BK] */
    float *S = Kt + (size_t)hd * BK;       /* [BQ][BK] */
    float *Q = S + (size_t)BQ * BK;        /* [BQ][hd] scaled */
    float *O = Q + (size_t)BQ * hd;        /* [BQ][hd] */
    float *M = O + (size_t)BQ * hd, *L = M + BQ;
    int nkr[BQ];

    for (int i = 0; i < nq; i++) {
        const float *q = qbase + (size_t)(t0 + i) * R;
        for (int d = 0; d < hd; d++) Q[(size_t)i * hd + d] = q[d] * g->scale;
        for (int d = 0; d < hd; d++) O[(size_t)i * hd + d] = 0.0f;
        M[i] = -INFINITY;
        L[i] = 0.0f;
    }
    int jmin = seg ? t0 : 0;
    if (seg)
        for (int i = 0; i < nq; i++) jmin = seg[t0 + i] < jmin ? seg[t0 + i] : jmin;
    if (jmin < 0) jmin = 0;
    const bool drop = g->p_drop > 0.0f;

    for (int j0 = (jmin / BK) * BK; j0 < t1; j0 += BK) {
        const int nk = j0 + BK < t1 ? BK : t1 - j0;
        for (int jj = 0; jj < nk; jj++) {
            const float *k = kbase + (size_t)(j0 + jj) * R;
            for (int d = 0; d < hd; d++) Kt[(size_t)d * BK + jj] = k[d];
        }
        for (int jj = nk; jj < BK; jj++)
            for (int d = 0; d < hd; d++) Kt[(size_t)d * BK + jj] = 0.0f;
        mk_a_rows(S, Q, (size_t)hd, Kt, hd, nq);
        for (int i = 0; i < nq; i++) {
            const int t = t0 + i;
            int lo = seg ? seg[t] : 0;
            int hi = t + 1; /* exclusive */
            lo = lo > j0 ? lo - j0 : 0;
            hi = hi - j0 < nk ? hi - j0 : nk;
            float *s = S + (size_t)i * BK;
            if (hi <= lo) {
                nkr[i] = 0;
                continue;
            }
            /* 16-lane max and sum over the full block width (masked), so they vectorise */
            float ls[16];
            for (int l = 0; l < 16; l++) ls[l] = 0.0f;
            const float mb = row_max(s, lo, hi);
            const float mnew = mb > M[i] ? mb : M[i];
            const float alpha = cpu_expf(M[i] - mnew);
            for (int j = 0; j < BK; j += 16)
                for (int l = 0; l < 16; l++) {
                    const int jj = j + l;
                    const float p = (jj >= lo && jj < hi) ? cpu_expf(s[jj] - mnew) : 0.0f;
                    s[jj] = p;
                    ls[l] += p;
                }
            float psum = 0.0f;
            for (int l = 0; l < 16; l++) psum += ls[l];
            L[i] = L[i] * alpha + psum;
            M[i] = mnew;
            if (drop) {
                uint64_t base = g->offset + (((uint64_t)b * g->nh + h) * T + t) * T + j0;
                for (int jj = 0; jj < BK; jj++) { /* full width: branch-free, vectorises */
                    const bool keep = kb_keep(g->seed, base + jj, g->p_drop);
                    s[jj] *= keep ? g->inv_keep : 0.0f;
                }
            }
            float *o = O + (size_t)i * hd;
            if (alpha != 1.0f)
                for (int d = 0; d < hd; d++) o[d] *= alpha;
            nkr[i] = hi;
        }
        mk_b_rows(O, (size_t)hd, S, BK, vbase + (size_t)j0 * R, R, nkr, hd, nq);
    }
    const int nhd = g->nh * hd;
    for (int i = 0; i < nq; i++) {
        const int t = t0 + i;
        float *o = out + ((size_t)b * T + t) * nhd + (size_t)h * hd;
        const float inv = 1.0f / L[i];
        for (int d = 0; d < hd; d++) o[d] = O[(size_t)i * hd + d] * inv;
        lse[((size_t)b * g->nh + h) * T + t] = M[i] + logf(L[i]);
    }
}

static void fwd_item_any(const attn_geo *g, float *out, float *lse, const float *qkv, int b,
                         int h, int qb, float *scr) {
    switch (g->hd) {
    case 64: fwd_item(g, out, lse, qkv, b, h, qb, scr, 64); break;
    case 128: fwd_item(g, out, lse, qkv, b, h, qb, scr, 128); break;
    default: fwd_item(g, out, lse, qkv, b, h, qb, scr, g->hd); break;
    }
}

static void geo_init(attn_geo *g, const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                     float p_drop, uint64_t seed, uint64_t offset) {
    g->B = B, g->T = T, g->nh = nh, g->nkv = nkv, g->hd = hd;
    g->rep = nkv > 0 ? nh / nkv : 1;
    if (g->rep < 1) g->rep = 1;
    g->R = (size_t)(nh + 2 * nkv) * hd;
    g->scale = 1.0f / sqrtf((float)hd);
    g->p_drop = p_drop > 0.0f ? p_drop : 0.0f;
    g->inv_keep = p_drop < 1.0f ? 1.0f / (1.0f - g->p_drop) : 0.0f;
    g->seed = seed, g->offset = offset, g->seg = seg;
}

void ATTN_FN(cpu_attention_forward)(kb_backend *b, float *out, float *lse, const float *qkv,
                           const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                           float p_drop, uint64_t seed, uint64_t offset) {
    cpu_state *st = cpu_st(b);
    if (B <= 0 || T <= 0 || nh <= 0 || hd <= 0) return;
    attn_geo g;
    geo_init(&g, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
    const size_t per = fwd_scratch_floats(hd);
    float *scr = cpu_scratch(st, CPU_SCR_ATTN, (size_t)st->threads * per * sizeof(float));
    if (!scr) {
        b->status = co_err_set(CO_ENOMEM, "attention_forward: cannot allocate scratch");
        return;
    }
    const int nqb = (T + BQ - 1) / BQ;
    /* items ordered so that the static partition mixes long (late) and short query blocks */
    const int items = B * nh * nqb;
#pragma omp parallel num_threads(st->threads)
    {
        float *my = scr + (size_t)omp_get_thread_num() * per;
#pragma omp for schedule(static, 1)
        for (int it = 0; it < items; it++) {
            int qb = it % nqb, bh = it / nqb;
            fwd_item_any(&g, out, lse, qkv, bh / nh, bh % nh, qb, my);
        }
    }
}

/* ---- backward ---- */

static size_t bwd_scratch_floats(int hd, int T) {
    return 2 * (size_t)hd * BK + 4 * (size_t)BQ * BK + 2 * (size_t)BK * hd + (size_t)T + 64;
}

AI void bwd_item(const attn_geo *g, float *dqkv, float *dkh, float *dvh, const float *dout,
                 const float *qkv, const float *out, const float *lse, int b, int h, float *scr,
                 const int hd) {
    const int T = g->T, nh = g->nh;
    const int grp = h / g->rep;
    const size_t R = g->R, nhd = (size_t)nh * hd;
    const float scale = g->scale;
    const float *qbase = qkv + (size_t)b * T * R + (size_t)h * hd;
    const float *kbase = qkv + (size_t)b * T * R + (size_t)(nh + grp) * hd;
    const float *vbase = qkv + (size_t)b * T * R + (size_t)(nh + g->nkv + grp) * hd;
    float *dqbase = dqkv + (size_t)b * T * R + (size_t)h * hd;
    const float *obase = out + (size_t)b * T * nhd + (size_t)h * hd;
    const float *dobase = dout + (size_t)b * T * nhd + (size_t)h * hd;
    const float *lrow = lse + ((size_t)b * nh + h) * T;
    float *dk = dkh + ((size_t)b * nh + h) * T * hd; /* [T][hd] */
    float *dv = dvh + ((size_t)b * nh + h) * T * hd;
    const int32_t *seg = g->seg ? g->seg + (size_t)b * T : NULL;
    const bool drop = g->p_drop > 0.0f;

    float *Kt = scr;                     /* [hd][BK] */
    float *Vt = Kt + (size_t)hd * BK;    /* [hd][BK] */
    float *P = Vt + (size_t)hd * BK;     /* [BQ][BK] dropped probabilities */
    float *dS = P + (size_t)BQ * BK;     /* [BQ][BK] dP, then dS * scale */
    float *PT = dS + (size_t)BQ * BK;    /* [BK][BQ] */
    float *dST = PT + (size_t)BQ * BK;   /* [BK][BQ] */
    float *dKj = dST + (size_t)BQ * BK;  /* [BK][hd] */
    float *dVj = dKj + (size_t)BK * hd;  /* [BK][hd] */
    float *D = dVj + (size_t)BK * hd;    /* [T] */
    int nkr[BQ], nqr[BK];

    for (int t = 0; t < T; t++) {
        const float *o = obase + (size_t)t * nhd, *d_o = dobase + (size_t)t * nhd;
        float acc[16] = {0};
        int d = 0;
        for (; d + 16 <= hd; d += 16)
            for (int l = 0; l < 16; l++) acc[l] += o[d + l] * d_o[d + l];
        for (int l = 0; d < hd; d++, l++) acc[l] += o[d] * d_o[d];
        float s = 0.0f;
        for (int l = 0; l < 16; l++) s += acc[l];
        D[t] = s;
        float *dq = dqbase + (size_t)t * R;
        for (d = 0; d < hd; d++) dq[d] = 0.0f;
    }

    for (int j0 = 0; j0 < T; j0 += BK) {
        const int nk = j0 + BK < T ? BK : T - j0;
        const int j1 = j0 + nk;
        for (int jj = 0; jj < nk; jj++) {
            const float *k = kbase + (size_t)(j0 + jj) * R, *v = vbase + (size_t)(j0 + jj) * R;
            for (int d = 0; d < hd; d++) {
                Kt[(size_t)d * BK + jj] = k[d];
                Vt[(size_t)d * BK + jj] = v[d];
            }
        }
        for (int jj = nk; jj < BK; jj++)
            for (int d = 0; d < hd; d++) Kt[(size_t)d * BK + jj] = Vt[(size_t)d * BK + jj] = 0.0f;
        memset(dKj, 0, (size_t)BK * hd * sizeof(float));
        memset(dVj, 0, (size_t)BK * hd * sizeof(float));

        for (int t0 = (j0 / BQ) * BQ; t0 < T; t0 += BQ) {
            const int nq = t0 + BQ < T ? BQ : T - t0;
            if (seg) {
                int smin = T;
                for (int i = 0; i < nq; i++) smin = seg[t0 + i] < smin ? seg[t0 + i] : smin;
                if (smin >= j1) continue;
            }
            const float *qblk = qbase + (size_t)t0 * R, *doblk = dobase + (size_t)t0 * nhd;
            mk_a_rows(P, qblk, R, Kt, hd, nq);
            mk_a_rows(dS, doblk, nhd, Vt, hd, nq);
            int lomin = BK;
            for (int i = 0; i < nq; i++) {
                const int t = t0 + i;
                int lo = seg ? seg[t] : 0, hi = t + 1;
                lo = lo > j0 ? lo - j0 : 0;
                hi = hi - j0 < nk ? hi - j0 : nk;
                float *p = P + (size_t)i * BK, *dp = dS + (size_t)i * BK;
                if (hi <= lo) {
                    for (int jj = 0; jj < BK; jj++) p[jj] = dp[jj] = 0.0f;
                    nkr[i] = 0;
                    continue;
                }
                lomin = lo < lomin ? lo : lomin;
                nkr[i] = hi;
                const float l = lrow[t], Dt = D[t];
                if (drop) {
                    uint64_t base = g->offset + (((uint64_t)b * nh + h) * T + t) * T + j0;
                    for (int jj = 0; jj < BK; jj++) {
                        const bool in = jj >= lo && jj < hi;
                        const bool keep = kb_keep(g->seed, base + jj, g->p_drop);
                        const float kp = (in & keep) ? g->inv_keep : 0.0f;
                        const float pr = in ? cpu_expf(p[jj] * scale - l) : 0.0f;
                        dp[jj] = pr * (dp[jj] * kp - Dt) * scale;
                        p[jj] = pr * kp;
                    }
                } else {
                    for (int jj = 0; jj < BK; jj++) {
                        const bool in = jj >= lo && jj < hi;
                        const float pr = in ? cpu_expf(p[jj] * scale - l) : 0.0f;
                        dp[jj] = pr * (dp[jj] - Dt) * scale;
                        p[jj] = pr;
                    }
                }
            }
            if (lomin >= BK) continue;
            /* transposes for the key-side products; rows beyond nq are zero */
            for (int i = 0; i < nq; i++)
                for (int jj = 0; jj < BK; jj++) {
                    PT[(size_t)jj * BQ + i] = P[(size_t)i * BK + jj];
                    dST[(size_t)jj * BQ + i] = dS[(size_t)i * BK + jj];
                }
            /* key jj is seen by query rows i >= jj + j0 - t0 (causal): all of them after the
             * diagonal block; use the full nq (entries are zero where masked) */
            for (int jj = 0; jj < BK; jj++) nqr[jj] = jj < nk ? nq : 0;
            mk_b_rows(dVj, (size_t)hd, PT, BQ, doblk, nhd, nqr, hd, nk);
            mk_b_rows(dKj, (size_t)hd, dST, BQ, qblk, R, nqr, hd, nk);
            mk_b_rows(dqbase + (size_t)t0 * R, R, dS, BK, kbase + (size_t)j0 * R, R, nkr, hd, nq);
        }
        for (int jj = 0; jj < nk; jj++) {
            memcpy(dk + (size_t)(j0 + jj) * hd, dKj + (size_t)jj * hd, (size_t)hd * sizeof(float));
            memcpy(dv + (size_t)(j0 + jj) * hd, dVj + (size_t)jj * hd, (size_t)hd * sizeof(float));
        }
    }
}

static void bwd_item_any(const attn_geo *g, float *dqkv, float *dkh, float *dvh,
                         const float *dout, const float *qkv, const float *out,
                         const float *lse, int b, int h, float *scr) {
    switch (g->hd) {
    case 64: bwd_item(g, dqkv, dkh, dvh, dout, qkv, out, lse, b, h, scr, 64); break;
    case 128: bwd_item(g, dqkv, dkh, dvh, dout, qkv, out, lse, b, h, scr, 128); break;
    default: bwd_item(g, dqkv, dkh, dvh, dout, qkv, out, lse, b, h, scr, g->hd); break;
    }
}

void ATTN_FN(cpu_attention_backward)(kb_backend *b, float *dqkv, const float *dout,
                            const float *qkv, const float *out, const float *lse,
                            const int32_t *seg, int B, int T, int nh, int nkv, int hd,
                            float p_drop, uint64_t seed, uint64_t offset) {
    cpu_state *st = cpu_st(b);
    if (B <= 0 || T <= 0 || nh <= 0 || hd <= 0) return;
    attn_geo g;
    geo_init(&g, seg, B, T, nh, nkv, hd, p_drop, seed, offset);
    const size_t per = bwd_scratch_floats(hd, T);
    float *scr = cpu_scratch(st, CPU_SCR_ATTN, (size_t)st->threads * per * sizeof(float));
    const size_t headsz = (size_t)B * nh * T * hd;
    float *dkh = cpu_scratch(st, CPU_SCR_MISC, 2 * headsz * sizeof(float));
    if (!scr || !dkh) {
        b->status = co_err_set(CO_ENOMEM, "attention_backward: cannot allocate scratch");
        return;
    }
    float *dvh = dkh + headsz;
    const int items = B * nh;
#pragma omp parallel num_threads(st->threads)
    {
        float *my = scr + (size_t)omp_get_thread_num() * per;
#pragma omp for schedule(static, 1)
        for (int it = 0; it < items; it++)
            bwd_item_any(&g, dqkv, dkh, dvh, dout, qkv, out, lse, it / nh, it % nh, my);
    }
    /* sum dK, dV over the query heads of each group, in head order */
    const int rep = g.rep;
    const size_t R = g.R;
#pragma omp parallel for schedule(static) num_threads(st->threads)
    for (int bt = 0; bt < B * T; bt++) {
        const int bb = bt / T, t = bt % T;
        float *row = dqkv + (size_t)bt * R;
        for (int kv = 0; kv < 2; kv++) {
            const float *src = kv ? dvh : dkh;
            for (int gg = 0; gg < nkv; gg++) {
                float *dst = row + (size_t)(nh + kv * nkv + gg) * hd;
                const float *s0 = src + (((size_t)bb * nh + (size_t)gg * rep) * T + t) * hd;
                memcpy(dst, s0, (size_t)hd * sizeof(float));
                for (int r = 1; r < rep; r++) {
                    const float *sr =
                        src + (((size_t)bb * nh + (size_t)gg * rep + r) * T + t) * hd;
                    for (int d = 0; d < hd; d++) dst[d] += sr[d];
                }
            }
        }
    }
}
