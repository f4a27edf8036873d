/* test_attention.c - causal GQA flash attention against a naive O(T^2) double-precision
 * reference (seg masks, GQA mapping, dropout mask from the documented counter), the
 * reference backward against central differences, and determinism. */
#include "kernels/cpu/cpu.h"
#include "tests/unit/kernels/kt_util.h"

typedef struct geo {
    int B, T, nh, nkv, hd;
    float p;
    uint64_t seed, offset;
    const int32_t *seg;
} geo;

#define ROW(g) ((size_t)((g)->nh + 2 * (g)->nkv) * (g)->hd)

static double keepscale(const geo *g, int b, int h, int t, int j) {
    if (g->p <= 0) return 1.0;
    uint64_t idx = (((uint64_t)b * g->nh + h) * g->T + t) * g->T + j;
    return kb_keep(g->seed, g->offset + idx, g->p) ? 1.0 / (1.0 - (double)g->p) : 0.0;
}

/* out[B*T, nh*hd], lse[B*nh*T]; returns sum(out * R) if R */
static double ref_fwd(const geo *g, double *out, double *lse, const double *qkv, const float *R) {
    const size_t row = ROW(g);
    const int hd = g->hd, rep = g->nh / g->nkv;
    const double sc = 1.0 / sqrt((double)hd);
    double L = 0;
    double *s = malloc((size_t)g->T * sizeof(double));
    for (int b = 0; b < g->B; b++)
        for (int h = 0; h < g->nh; h++) {
            const int kv = h / rep;
            for (int t = 0; t < g->T; t++) {
                const double *q = qkv + ((size_t)b * g->T + t) * row + (size_t)h * hd;
                int lo = g->seg ? g->seg[(size_t)b * g->T + t] : 0;
                double m = -INFINITY;
                for (int j = lo; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * g->T + j) * row + (size_t)(g->nh + kv) * hd;
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += q[c] * k[c];
                    s[j] = d * sc;
                    m = s[j] > m ? s[j] : m;
                }
                double z = 0;
                for (int j = lo; j <= t; j++) z += exp(s[j] - m);
                if (lse) lse[((size_t)b * g->nh + h) * g->T + t] = m + log(z);
                for (int c = 0; c < hd; c++) {
                    double o = 0;
                    for (int j = lo; j <= t; j++) {
                        const double *v = qkv + ((size_t)b * g->T + j) * row +
                                          (size_t)(g->nh + g->nkv + kv) * hd;
                        o += exp(s[j] - m) / z * keepscale(g, b, h, t, j) * v[c];
                    }
                    size_t oi = ((size_t)b * g->T + t) * g->nh * hd + (size_t)h * hd + c;
                    if (out) out[oi] = o;
                    if (R) L += o * R[oi];
                }
            }
        }
    free(s);
    return L;
}

/* straightforward backward of ref_fwd: dqkv (overwritten) from dout */
static void ref_bwd(const geo *g, double *dqkv, const double *qkv, const float *dout) {
    const size_t row = ROW(g);
    const int hd = g->hd, rep = g->nh / g->nkv, T = g->T;
    const double sc = 1.0 / sqrt((double)hd);
    memset(dqkv, 0, (size_t)g->B * T * row * sizeof(double));
    double *p = malloc(T * sizeof(double)), *dp = malloc(T * sizeof(double));
    for (int b = 0; b < g->B; b++)
        for (int h = 0; h < g->nh; h++) {
            const int kv = h / rep;
            for (int t = 0; t < T; t++) {
                const double *q = qkv + ((size_t)b * T + t) * row + (size_t)h * hd;
                const float *d_o = dout + ((size_t)b * T + t) * g->nh * hd + (size_t)h * hd;
                int lo = g->seg ? g->seg[(size_t)b * T + t] : 0;
                double m = -INFINITY;
                for (int j = lo; j <= t; j++) {
                    const double *k = qkv + ((size_t)b * T + j) * row + (size_t)(g->nh + kv) * hd;
                    double d = 0;
                    for (int c = 0; c < hd; c++) d += q[c] * k[c];
                    p[j] = d * sc;
                    m = p[j] > m ? p[j] : m;
                }
                double z = 0;
                for (int j = lo; j <= t; j++) z += exp(p[j] - m);
                double D = 0;
                for (int j = lo; j <= t; j++) {
                    p[j] = exp(p[j] - m) / z;
                    const double *v = qkv + ((size_t)b * T + j) * row + (size_t)(g->nh + g->nkv + kv) * hd;
                    double ks = keepscale(g, b, h, t, j), d = 0;
                    for (int c = 0; c < hd; c++) d += d_o[c] * v[c];
                    dp[j] = d * ks;
                    D += p[j] * dp[j];
                    double *dv = dqkv + ((size_t)b * T + j) * row + (size_t)(g->nh + g->nkv + kv) * hd;
                    for (int c = 0; c < hd; c++) dv[c] += p[j] * ks * d_o[c];
                }
                double *dq = dqkv + ((size_t)b * T + t) * row + (size_t)h * hd;
                for (int j = lo; j <= t; j++) {
                    double ds = p[j] * (dp[j] - D) * sc;
                    const double *k = qkv + ((size_t)b * T + j) * row + (size_t)(g->nh + kv) * hd;
                    double *dk = dqkv + ((size_t)b * T + j) * row + (size_t)(g->nh + kv) * hd;
                    for (int c = 0; c < hd; c++) {
                        dq[c] += ds * k[c];
                        dk[c] += ds * q[c];
                    }
                }
            }
        }
    free(p), free(dp);
}

static int32_t *make_seg(int B, int T, int ndocs) {
    int32_t *seg = malloc((size_t)B * T * sizeof(int32_t));
    for (int b = 0; b < B; b++) {
        int start = 0;
        for (int t = 0; t < T; t++) {
            /* document boundaries at random places (a few per sequence), b = 0 has none */
            if (b > 0 && t > 0 && kt_randint(T) < ndocs) start = t;
            seg[(size_t)b * T + t] = start;
        }
    }
    return seg;
}

/* The reference backward is itself checked against central differences (tiny sizes). */
static void test_reference_backward_fd(void) {
    int32_t *seg = make_seg(2, 7, 3);
    geo cases[3] = {
        {.B = 2, .T = 7, .nh = 4, .nkv = 2, .hd = 3, .p = 0.0f, .seg = NULL},
        {.B = 2, .T = 7, .nh = 4, .nkv = 1, .hd = 3, .p = 0.0f, .seg = seg},
        {.B = 2, .T = 7, .nh = 2, .nkv = 2, .hd = 4, .p = 0.3f, .seed = 9, .offset = 77, .seg = seg},
    };
    for (int ci = 0; ci < 3; ci++) {
        geo *g = &cases[ci];
        size_t n = (size_t)g->B * g->T * ROW(g), no = (size_t)g->B * g->T * g->nh * g->hd;
        float *x = kt_rand(n, 1.5f), *R = kt_rand(no, 1.0f);
        double *xd = kt_dcopy(x, n), *gr = malloc(n * sizeof(double));
        ref_bwd(g, gr, xd, R);
        double worst = 0;
        for (size_t i = 0; i < n; i++) {
            const double h = 1e-6, s = xd[i];
            xd[i] = s + h;
            double lp = ref_fwd(g, NULL, NULL, xd, R);
            xd[i] = s - h;
            double lm = ref_fwd(g, NULL, NULL, xd, R);
            xd[i] = s;
            double e = fabs((lp - lm) / (2 * h) - gr[i]) / (1e-6 + 1e-5 * fabs(gr[i]));
            worst = e > worst ? e : worst;
        }
        CHECK_MSG(worst <= 1, "case %d worst %g", ci, worst);
        free(x), free(R), free(xd), free(gr);
    }
    free(seg);
}

static void attn_case(kb_backend *kb, geo g, double *max_err_out) {
    size_t n = (size_t)g.B * g.T * ROW(&g), no = (size_t)g.B * g.T * g.nh * g.hd;
    size_t nl = (size_t)g.B * g.nh * g.T;
    float *x = kt_rand(n, 2.0f), *out = kt_rand(no, 5), *lse = kt_rand(nl, 5);
    kb->ops->attention_forward(kb, out, lse, x, g.seg, g.B, g.T, g.nh, g.nkv, g.hd, g.p, g.seed, g.offset);
    double *xd = kt_dcopy(x, n), *ro = malloc(no * sizeof(double)), *rl = malloc(nl * sizeof(double));
    ref_fwd(&g, ro, rl, xd, NULL);
    double e1 = kt_worst(out, ro, no, 1e-5, 1e-4), e2 = kt_worst(lse, rl, nl, 1e-5, 1e-5);
    CHECK_MSG(e1 <= 1 && e2 <= 1, "fwd B=%d T=%d nh=%d nkv=%d hd=%d p=%g seg=%d: %g %g", g.B, g.T, g.nh,
              g.nkv, g.hd, g.p, g.seg != NULL, e1, e2);
    float *dout = kt_rand(no, 1.0f), *dq = kt_rand(n, 5);
    kb->ops->attention_backward(kb, dq, dout, x, out, lse, g.seg, g.B, g.T, g.nh, g.nkv, g.hd, g.p, g.seed,
                                g.offset);
    double *rg = malloc(n * sizeof(double));
    ref_bwd(&g, rg, xd, dout);
    double e3 = kt_worst(dq, rg, n, 1e-4, 1e-3);
    CHECK_MSG(e3 <= 1, "bwd B=%d T=%d nh=%d nkv=%d hd=%d p=%g seg=%d: %g", g.B, g.T, g.nh, g.nkv, g.hd, g.p,
              g.seg != NULL, e3);
    /* determinism: run again (and on a 1-thread backend: items are independent of threads) */
    float *out2 = kt_rand(no, 1), *lse2 = kt_rand(nl, 1), *dq2 = kt_rand(n, 1);
    kb_backend *k1 = kt_backend(1, false);
    for (int r = 0; r < 2; r++) {
        kb_backend *k = r ? k1 : kb;
        k->ops->attention_forward(k, out2, lse2, x, g.seg, g.B, g.T, g.nh, g.nkv, g.hd, g.p, g.seed, g.offset);
        k->ops->attention_backward(k, dq2, dout, x, out2, lse2, g.seg, g.B, g.T, g.nh, g.nkv, g.hd, g.p,
                                   g.seed, g.offset);
        CHECK(memcmp(out, out2, no * 4) == 0 && memcmp(lse, lse2, nl * 4) == 0 &&
              memcmp(dq, dq2, n * 4) == 0);
    }
    kb_backend_destroy(&k1);
    if (max_err_out) *max_err_out = e3;
    free(x), free(out), free(lse), free(xd), free(ro), free(rl), free(dout), free(dq), free(rg);
    free(out2), free(lse2), free(dq2);
}

static kb_backend *KB;

static void test_attention_small(void) {
    attn_case(KB, (geo){.B = 2, .T = 9, .nh = 4, .nkv = 2, .hd = 8}, NULL);
    attn_case(KB, (geo){.B = 1, .T = 5, .nh = 1, .nkv = 1, .hd = 1}, NULL);
}

static void test_attention_blocks(void) {
    /* several 64-wide blocks, ragged tail, hd = 64 (specialised path) and odd hd */
    attn_case(KB, (geo){.B = 2, .T = 150, .nh = 4, .nkv = 2, .hd = 64}, NULL);
    attn_case(KB, (geo){.B = 1, .T = 130, .nh = 3, .nkv = 3, .hd = 12}, NULL);
    attn_case(KB, (geo){.B = 1, .T = 70, .nh = 2, .nkv = 1, .hd = 128}, NULL);
}

static void test_attention_gqa_seg_dropout(void) {
    int32_t *seg = make_seg(3, 140, 4);
    attn_case(KB, (geo){.B = 3, .T = 140, .nh = 6, .nkv = 2, .hd = 16, .seg = seg}, NULL);
    attn_case(KB, (geo){.B = 3, .T = 140, .nh = 4, .nkv = 1, .hd = 64, .seg = seg}, NULL);
    attn_case(KB, (geo){.B = 3, .T = 140, .nh = 4, .nkv = 2, .hd = 64, .p = 0.2f, .seed = 5, .offset = 1000,
                        .seg = seg},
              NULL);
    attn_case(KB, (geo){.B = 2, .T = 77, .nh = 2, .nkv = 2, .hd = 24, .p = 0.5f, .seed = 6, .offset = 3},
              NULL);
    /* documents that start exactly on a block boundary and a one-token document */
    int32_t *s2 = malloc(2 * 130 * sizeof(int32_t));
    for (int t = 0; t < 130; t++) {
        s2[t] = t < 64 ? 0 : (t < 65 ? 64 : (t < 128 ? 65 : 128));
        s2[130 + t] = t; /* every token its own document */
    }
    attn_case(KB, (geo){.B = 2, .T = 130, .nh = 2, .nkv = 1, .hd = 64, .seg = s2}, NULL);
    free(seg), free(s2);
}

/* the dropout mask really is applied, replayed by backward, and keyed by (seed, offset) */
static void test_attention_dropout_mask(void) {
    geo g = {.B = 1, .T = 40, .nh = 2, .nkv = 1, .hd = 8, .p = 0.5f, .seed = 11, .offset = 0};
    size_t n = (size_t)g.T * ROW(&g), no = (size_t)g.T * g.nh * g.hd;
    float *x = kt_rand(n, 1), *o1 = kt_rand(no, 1), *o2 = kt_rand(no, 1), *o3 = kt_rand(no, 1);
    float *l = kt_rand(2 * 40, 1);
    KB->ops->attention_forward(KB, o1, l, x, NULL, g.B, g.T, g.nh, g.nkv, g.hd, 0.5f, 11, 0);
    KB->ops->attention_forward(KB, o2, l, x, NULL, g.B, g.T, g.nh, g.nkv, g.hd, 0.5f, 11, 0);
    CHECK(memcmp(o1, o2, no * 4) == 0);
    KB->ops->attention_forward(KB, o3, l, x, NULL, g.B, g.T, g.nh, g.nkv, g.hd, 0.5f, 11, 1);
    CHECK(memcmp(o1, o3, no * 4) != 0);
    KB->ops->attention_forward(KB, o3, l, x, NULL, g.B, g.T, g.nh, g.nkv, g.hd, 0.0f, 11, 0);
    CHECK(memcmp(o1, o3, no * 4) != 0);
    free(x), free(o1), free(o2), free(o3), free(l);
}

/* the variant the dispatcher runs follows the CPU's level (ONEDNN_MAX_CPU_ISA=AVX2 runs the
 * AVX2 kernels on an AVX-512 machine: the unit suite runs this file both ways) */
static void test_variant(void) {
    int level = cpu_isa_level();
    const char *v = cpu_attention_variant();
    fprintf(stderr, "  attention variant %s at level %s\n", v, cpu_isa_name(level));
#if defined(COHORT_ATTN_AVX512) && defined(COHORT_ATTN_AVX2)
    CHECK(strcmp(v, level >= CPU_ISA_AVX512 ? "avx512" : level >= CPU_ISA_AVX2 ? "avx2" : "base") == 0);
#endif
    CHECK(strstr(kb_backend_describe(KB), v) != NULL);
}

int main(void) {
    KB = kt_backend(2, false);
    RUN(test_variant);
    RUN(test_reference_backward_fd);
    RUN(test_attention_small);
    RUN(test_attention_blocks);
    RUN(test_attention_gqa_seg_dropout);
    RUN(test_attention_dropout_mask);
    kb_backend_destroy(&KB);
    return TEST_EXIT();
}
