/* test_kernels.c - the CPU backend's operations (everything except attention) against
 * double-precision reference loops and finite differences. */
#include "kernels/checksum.h"
#include "common/error.h"
#include "tests/unit/kernels/kt_util.h"

static kb_backend *B32, *B16;

/* ---------------------------------------------------------------- backend object */

static void test_backend_new(void) {
    kb_backend *b = NULL;
    kb_options o = {.device = KB_DEVICE_CPU, .threads = 0};
    REQUIRE(kb_backend_new(&b, &o) == 0);
    CHECK(b != NULL && b->ops != NULL && b->opt.threads >= 1);
    CHECK(strncmp(kb_backend_describe(b), "cpu: oneDNN", 11) == 0);
    CHECK(strstr(kb_backend_describe(b), "fp32") != NULL);
    float *p = b->ops->alloc(b, 1000);
    CHECK(p != NULL && ((uintptr_t)p & 63) == 0);
    int zero = 1;
    for (int i = 0; i < 250; i++) zero &= p[i] == 0.0f;
    CHECK(zero);
    b->ops->free(b, p);
    kb_backend_destroy(&b);
    CHECK(b == NULL);
    kb_backend_destroy(&b); /* idempotent */

    o.device = KB_DEVICE_CUDA;
    if (kb_cuda_available(NULL, 0)) { /* a GPU machine: the CUDA backend is tested by the gpu suite */
        CHECK(kb_backend_new(&b, &o) == 0);
        kb_backend_destroy(&b);
    } else {
        CHECK(kb_backend_new(&b, &o) == CO_EUNSUPPORTED);
        CHECK(b == NULL);
        /* without a GPU (or a CUDA build) the detail says why */
        CHECK(strstr(co_err_detail(), "CUDA") != NULL);
    }

    CHECK(strstr(kb_backend_describe(B32), "2 threads") != NULL);
    CHECK(strstr(kb_backend_describe(B32), " kernels") != NULL);
    if (B16) CHECK(strstr(kb_backend_describe(B16), "bf16") != NULL);
}

/* --bf16 where the CPU has no bf16 matrix instructions: refused with a reason, never a
 * backend that silently computes in fp32 (or slowly emulates bf16) */
static void test_bf16_choice(void) {
    char why[400] = "";
    int ok = kb_cpu_bf16_check(why, sizeof why);
    char isa[300];
    kb_cpu_describe_isa(isa, sizeof isa);
    fprintf(stderr, "  cpu: %s; bf16 %s\n", isa, ok ? "native" : "refused");
    kb_options o = {.device = KB_DEVICE_CPU, .threads = 1, .bf16 = true};
    kb_backend *b = NULL;
    int rc = kb_backend_new(&b, &o);
    if (ok) {
        CHECK(rc == 0 && b != NULL);
        CHECK(strstr(isa, "AMX") || strstr(isa, "AVX-512 BF16"));
    } else {
        CHECK(rc == CO_EUNSUPPORTED && b == NULL);
        CHECK(strstr(co_err_detail(), "--bf16") != NULL);
        CHECK(strstr(co_err_detail(), "without --bf16") != NULL);
        CHECK(strstr(why, "--bf16") != NULL);
    }
    kb_backend_destroy(&b);
}

/* ---------------------------------------------------------------- memory, bf16 */

static void test_zero_to_bf16(void) {
    size_t n = 40000;
    float *x = kt_rand(n, 3.0f);
    B32->ops->zero(B32, x + 1, n - 2);
    CHECK(x[0] != 0.0f && x[n - 1] != 0.0f);
    int ok = 1;
    for (size_t i = 1; i < n - 1; i++) ok &= x[i] == 0.0f;
    CHECK(ok);
    free(x);

    float v[8];
    uint32_t bits[8] = {0x3f800000u, 0x3f808000u, 0x3f818000u, 0x3f808001u,
                        0x7f800000u, 0xff800000u, 0x7fc00001u, 0x7f800001u};
    memcpy(v, bits, sizeof v);
    kb_bf16 h[8];
    B32->ops->to_bf16(B32, h, v, 8);
    CHECK(h[0] == 0x3f80);
    CHECK(h[1] == 0x3f80); /* tie -> even */
    CHECK(h[2] == 0x3f82); /* tie -> even (up) */
    CHECK(h[3] == 0x3f81); /* above the tie -> up */
    CHECK(h[4] == 0x7f80 && h[5] == 0xff80);
    CHECK((h[6] & 0x7f80) == 0x7f80 && (h[6] & 0x7f) != 0); /* NaN stays NaN */
    CHECK((h[7] & 0x7f80) == 0x7f80 && (h[7] & 0x7f) != 0); /* signalling NaN too */

    n = 50001;
    x = kt_rand(n, 100.0f);
    kb_bf16 *y = malloc(n * sizeof *y);
    B32->ops->to_bf16(B32, y, x, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)y[i] << 16;
        float f;
        memcpy(&f, &u, 4);
        ok &= (double)f == kt_bf(x[i]);
    }
    CHECK(ok);
    free(x);
    free(y);
}

/* ---------------------------------------------------------------- linear */

static void ref_linear(double *out, const double *in, const double *W, const float *bias,
                       int N, int IC, int OC) {
    for (int n = 0; n < N; n++)
        for (int o = 0; o < OC; o++) {
            double s = bias ? bias[o] : 0.0;
            for (int i = 0; i < IC; i++) s += in[(size_t)n * IC + i] * W[(size_t)o * IC + i];
            out[(size_t)n * OC + o] = s;
        }
}

/* the value a product multiplies: bf16- or fp16-rounded (the compiler's _Float16 conversion,
 * round to nearest even, is the reference of the backend's own) in those modes */
static double q16(const kb_backend *b, float x) {
    return b->opt.bf16 ? kt_bf(x) : b->opt.fp16 ? (double)(_Float16)x : (double)x;
}

static void linear_case(kb_backend *b, int N, int IC, int OC, bool use_bias, bool give_w16) {
    bool bf = b->opt.bf16 || b->opt.fp16;
    float *in = kt_rand((size_t)N * IC, 1.0f), *W = kt_rand((size_t)OC * IC, 0.5f);
    float *bias = use_bias ? kt_rand(OC, 1.0f) : NULL;
    float *out = kt_rand((size_t)N * OC, 7.0f); /* garbage: must be overwritten */
    kb_bf16 *W16 = NULL;
    if (give_w16) {
        W16 = malloc((size_t)OC * IC * sizeof *W16);
        b->ops->to_bf16(b, W16, W, (size_t)OC * IC);
    }
    double *din_ = malloc((size_t)N * IC * sizeof(double));
    double *dW_ = malloc((size_t)OC * IC * sizeof(double));
    double *ref = malloc((size_t)N * OC * sizeof(double));
    /* reference on the values the kernel multiplies: bf16-rounded in bf16 mode */
    for (size_t i = 0; i < (size_t)N * IC; i++) din_[i] = q16(b, in[i]);
    for (size_t i = 0; i < (size_t)OC * IC; i++) dW_[i] = q16(b, W[i]);
    ref_linear(ref, din_, dW_, bias, N, IC, OC);
    b->ops->linear_forward(b, out, in, W, W16, bias, N, IC, OC);
    CHECK_MSG(kt_worst(out, ref, (size_t)N * OC, 1e-4, 1e-4) <= 1.0, "linear fwd N=%d IC=%d OC=%d bf16=%d",
              N, IC, OC, bf);
    if (bf) {
        /* and within bf16 tolerance of the exact fp32 product */
        double *ex = malloc((size_t)N * OC * sizeof(double));
        double *a = kt_dcopy(in, (size_t)N * IC), *w = kt_dcopy(W, (size_t)OC * IC);
        ref_linear(ex, a, w, bias, N, IC, OC);
        double tol = 2.0 * 0.0078125 * sqrt((double)IC) * 0.5;
        CHECK(kt_worst(out, ex, (size_t)N * OC, tol, 0.0) <= 1.0);
        free(ex), free(a), free(w);
    }

    /* backward: din overwritten, dW and dbias accumulate */
    float *dout = kt_rand((size_t)N * OC, 1.0f);
    float *din = kt_rand((size_t)N * IC, 5.0f);
    float *dW = kt_rand((size_t)OC * IC, 1.0f), *dW0 = kt_copy(dW, (size_t)OC * IC);
    float *db = kt_rand(OC, 1.0f), *db0 = kt_copy(db, OC);
    b->ops->linear_backward(b, din, dW, use_bias ? db : NULL, dout, in, W, W16, N, IC, OC);
    double *r = malloc((size_t)(N > OC ? N : OC) * (IC > OC ? IC : OC) * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < IC; i++) {
            double s = 0;
            for (int o = 0; o < OC; o++)
                s += q16(b, dout[(size_t)n * OC + o]) * dW_[(size_t)o * IC + i];
            r[(size_t)n * IC + i] = s;
        }
    CHECK_MSG(kt_worst(din, r, (size_t)N * IC, 1e-4, 1e-4) <= 1.0, "linear din N=%d IC=%d OC=%d bf16=%d", N,
              IC, OC, bf);
    for (int o = 0; o < OC; o++)
        for (int i = 0; i < IC; i++) {
            double s = dW0[(size_t)o * IC + i];
            for (int n = 0; n < N; n++)
                s += q16(b, dout[(size_t)n * OC + o]) * din_[(size_t)n * IC + i];
            r[(size_t)o * IC + i] = s;
        }
    CHECK_MSG(kt_worst(dW, r, (size_t)OC * IC, 1e-4, 1e-4) <= 1.0, "linear dW N=%d IC=%d OC=%d bf16=%d", N,
              IC, OC, bf);
    if (use_bias) {
        for (int o = 0; o < OC; o++) {
            double s = db0[o];
            for (int n = 0; n < N; n++) s += dout[(size_t)n * OC + o];
            r[o] = s;
        }
        CHECK(kt_worst(db, r, OC, 1e-5, 1e-5) <= 1.0);
    }
    /* din == NULL: only parameter gradients */
    memcpy(dW, dW0, (size_t)OC * IC * sizeof(float));
    float *dW2 = kt_copy(dW0, (size_t)OC * IC);
    b->ops->linear_backward(b, NULL, dW2, NULL, dout, in, W, W16, N, IC, OC);
    b->ops->linear_backward(b, din, dW, NULL, dout, in, W, W16, N, IC, OC);
    CHECK(memcmp(dW, dW2, (size_t)OC * IC * sizeof(float)) == 0);
    free(in), free(W), free(bias), free(out), free(W16), free(din_), free(dW_), free(ref);
    free(dout), free(din), free(dW), free(dW0), free(db), free(db0), free(r), free(dW2);
}

static void test_linear_fp32(void) {
    linear_case(B32, 37, 29, 19, true, false);
    linear_case(B32, 64, 96, 48, false, false);
    linear_case(B32, 1, 7, 3, true, false);
}

/* bf16 products; where the CPU has no bf16 instructions, the backend that GPU tests take as
 * their reference there (kb_options.bf16_reference: oneDNN's slower paths), same checks */
static void test_linear_bf16(void) {
    kb_backend *b = B16;
    if (!b) {
        kb_options o = {.device = KB_DEVICE_CPU, .threads = 2, .bf16 = true, .bf16_reference = true};
        REQUIRE(kb_backend_new(&b, &o) == 0);
        CHECK(strstr(kb_backend_describe(b), "bf16") != NULL);
    }
    linear_case(b, 37, 29, 19, true, false);
    linear_case(b, 64, 96, 48, false, true);
    linear_case(b, 128, 64, 192, true, true);
    /* same shape again: served by the cached primitive */
    linear_case(b, 128, 64, 192, true, true);
    if (b != B16) kb_backend_destroy(&b);
}

/* fp16 products (--fp16): every CPU, inputs rounded to fp16 as the compiler's _Float16 does
 * (checked over every fp16 value and around each rounding boundary), fp32 accumulation */
static void test_linear_fp16(void) {
    kb_options o = {.device = KB_DEVICE_CPU, .threads = 2, .fp16 = true};
    kb_backend *b;
    REQUIRE(kb_backend_new(&b, &o) == 0);
    CHECK(strstr(kb_backend_describe(b), "fp16") != NULL);
    /* the conversion: every half widened and rounded back is itself (NaN stays NaN), and
     * floats near every half and the midpoints between halves round as _Float16 does */
    uint16_t *h = malloc(65536 * sizeof *h);
    float *f = malloc(65536 * 4 * sizeof *f);
    REQUIRE(h && f);
    int bad = 0;
    for (uint32_t i = 0; i < 65536; i++) {
        _Float16 x;
        uint16_t u = (uint16_t)i;
        memcpy(&x, &u, 2);
        float v = (float)x;
        f[4 * i] = v, f[4 * i + 1] = nextafterf(v, INFINITY), f[4 * i + 2] = nextafterf(v, -INFINITY);
        uint16_t nxt = (uint16_t)(i + 1);
        _Float16 y;
        memcpy(&y, &nxt, 2);
        f[4 * i + 3] = (float)(((double)x + (double)y) / 2); /* the tie (exact in float) */
    }
    for (int k = 0; k < 16; k++) { /* 65536 x 4 floats, 16384 per call */
        b->ops->to_bf16(b, h, f + k * 16384, 16384);
        for (int i = 0; i < 16384; i++) {
            float v = f[k * 16384 + i];
            _Float16 want = (_Float16)v;
            uint16_t w;
            memcpy(&w, &want, 2);
            bool nan = v != v;
            if (nan ? (h[i] & 0x7c00) != 0x7c00 || !(h[i] & 0x3ff) : h[i] != w) bad++;
        }
    }
    CHECK_MSG(bad == 0, "%d conversions differ from _Float16's", bad);
    free(h), free(f);
    linear_case(b, 37, 29, 19, true, false);
    linear_case(b, 64, 96, 48, false, true);
    /* beyond fp16's range a product's input is Inf (the loss scale's overflow) */
    float in[2] = {70000.0f, 1.0f}, W[2] = {1.0f, 1.0f}, out[1];
    b->ops->linear_forward(b, out, in, W, NULL, NULL, 1, 2, 1);
    CHECK(isinf(out[0]));
    kb_backend_destroy(&b);
}

/* ---------------------------------------------------------------- embeddings */

static void test_embed(void) {
    int N = 50, C = 70, V = 11, P = 9;
    int32_t tok[50], pos[50];
    for (int n = 0; n < N; n++) tok[n] = kt_randint(V), pos[n] = n % P;
    tok[3] = tok[4] = tok[40] = 5; /* repeats */
    float *wte = kt_rand((size_t)V * C, 1), *wpe = kt_rand((size_t)P * C, 1);
    float *out = kt_rand((size_t)N * C, 1);
    B32->ops->embed_forward(B32, out, tok, pos, wte, wpe, N, C);
    int ok = 1;
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++)
            ok &= out[(size_t)n * C + c] == wte[(size_t)tok[n] * C + c] + wpe[(size_t)pos[n] * C + c];
    CHECK(ok);
    B32->ops->embed_forward(B32, out, tok, NULL, wte, NULL, N, C);
    ok = 1;
    for (int n = 0; n < N; n++) ok &= memcmp(out + (size_t)n * C, wte + (size_t)tok[n] * C, C * 4) == 0;
    CHECK(ok);

    float *dout = kt_rand((size_t)N * C, 1);
    float *dwte = kt_rand((size_t)V * C, 1), *dwpe = kt_rand((size_t)P * C, 1);
    double *rte = kt_dcopy(dwte, (size_t)V * C), *rpe = kt_dcopy(dwpe, (size_t)P * C);
    for (int n = 0; n < N; n++)
        for (int c = 0; c < C; c++) {
            rte[(size_t)tok[n] * C + c] += dout[(size_t)n * C + c];
            rpe[(size_t)pos[n] * C + c] += dout[(size_t)n * C + c];
        }
    float *dwte2 = kt_copy(dwte, (size_t)V * C);
    B32->ops->embed_backward(B32, dwte, dwpe, dout, tok, pos, N, C, V);
    CHECK(kt_worst(dwte, rte, (size_t)V * C, 1e-5, 1e-5) <= 1);
    CHECK(kt_worst(dwpe, rpe, (size_t)P * C, 1e-5, 1e-5) <= 1);
    B32->ops->embed_backward(B32, dwte2, NULL, dout, tok, pos, N, C, V);
    CHECK(memcmp(dwte, dwte2, (size_t)V * C * 4) == 0); /* same order with or without dwpe */
    free(wte), free(wpe), free(out), free(dout), free(dwte), free(dwpe), free(rte), free(rpe);
    free(dwte2);
}

/* ---------------------------------------------------------------- norms */

/* double reference forward; returns sum(out * R) */
static double ref_norm(bool rms, double *out, const double *x, const double *w,
                       const double *bias, const float *R, int N, int C, double eps) {
    double L = 0;
    for (int n = 0; n < N; n++) {
        const double *xr = x + (size_t)n * C;
        double mu = 0, var = 0;
        if (!rms) {
            for (int c = 0; c < C; c++) mu += xr[c];
            mu /= C;
        }
        for (int c = 0; c < C; c++) var += (xr[c] - mu) * (xr[c] - mu);
        var /= C;
        double rs = 1.0 / sqrt(var + eps);
        for (int c = 0; c < C; c++) {
            double y = (xr[c] - mu) * rs * w[c] + (!rms && bias ? bias[c] : 0.0);
            if (out) out[(size_t)n * C + c] = y;
            if (R) L += y * R[(size_t)n * C + c];
        }
    }
    return L;
}

static void norm_case(bool rms, int N, int C) {
    const float eps = 1e-5f;
    float *x = kt_rand((size_t)N * C, 2.0f), *w = kt_rand(C, 1.0f), *bias = kt_rand(C, 1.0f);
    for (int n = 0; n < N; n++) x[(size_t)n * C] += 3.0f * (float)n / N; /* nonzero means */
    float *out = kt_rand((size_t)N * C, 1), *mean = kt_rand(N, 1), *rstd = kt_rand(N, 1);
    B32->ops->norm_forward(B32, rms, out, rms ? NULL : mean, rstd, x, w, rms ? NULL : bias, N, C, eps);
    double *xd = kt_dcopy(x, (size_t)N * C), *wd = kt_dcopy(w, C), *bd = kt_dcopy(bias, C);
    double *ref = malloc((size_t)N * C * sizeof(double));
    ref_norm(rms, ref, xd, wd, rms ? NULL : bd, NULL, N, C, eps);
    CHECK_MSG(kt_worst(out, ref, (size_t)N * C, 1e-5, 1e-4) <= 1, "norm fwd rms=%d", rms);

    /* backward vs central differences of L = sum(out * R) of the double reference */
    float *R = kt_rand((size_t)N * C, 1.0f);
    float *din = kt_rand((size_t)N * C, 1.0f), *din0 = kt_copy(din, (size_t)N * C);
    float *dw = kt_rand(C, 1), *dw0 = kt_copy(dw, C), *db = kt_rand(C, 1), *db0 = kt_copy(db, C);
    B32->ops->norm_backward(B32, rms, din, dw, rms ? NULL : db, R, x, w, rms ? NULL : mean, rstd, N, C);
    const double h = 1e-6;
    double *g = malloc((size_t)N * C * sizeof(double));
    for (size_t i = 0; i < (size_t)N * C; i++) {
        double s = xd[i];
        xd[i] = s + h;
        double lp = ref_norm(rms, NULL, xd, wd, bd, R, N, C, eps);
        xd[i] = s - h;
        double lm = ref_norm(rms, NULL, xd, wd, bd, R, N, C, eps);
        xd[i] = s;
        g[i] = din0[i] + (lp - lm) / (2 * h);
    }
    CHECK_MSG(kt_worst(din, g, (size_t)N * C, 1e-4, 1e-3) <= 1, "norm din rms=%d", rms);
    for (int c = 0; c < C; c++) {
        double s = wd[c];
        wd[c] = s + h;
        double lp = ref_norm(rms, NULL, xd, wd, bd, R, N, C, eps);
        wd[c] = s - h;
        double lm = ref_norm(rms, NULL, xd, wd, bd, R, N, C, eps);
        wd[c] = s;
        g[c] = dw0[c] + (lp - lm) / (2 * h);
    }
    CHECK_MSG(kt_worst(dw, g, C, 1e-4, 1e-3) <= 1, "norm dw rms=%d", rms);
    if (!rms) {
        for (int c = 0; c < C; c++) {
            double s = bd[c];
            bd[c] = s + h;
            double lp = ref_norm(rms, NULL, xd, wd, bd, R, N, C, eps);
            bd[c] = s - h;
            double lm = ref_norm(rms, NULL, xd, wd, bd, R, N, C, eps);
            bd[c] = s;
            g[c] = db0[c] + (lp - lm) / (2 * h);
        }
        CHECK(kt_worst(db, g, C, 1e-4, 1e-3) <= 1);
    } else {
        CHECK(memcmp(db, db0, C * 4) == 0); /* RMSNorm has no bias */
    }
    /* determinism */
    float *din2 = kt_copy(din0, (size_t)N * C), *dw2 = kt_copy(dw0, C), *db2 = kt_copy(db0, C);
    B32->ops->norm_backward(B32, rms, din2, dw2, rms ? NULL : db2, R, x, w, rms ? NULL : mean, rstd, N, C);
    CHECK(memcmp(din, din2, (size_t)N * C * 4) == 0 && memcmp(dw, dw2, C * 4) == 0 &&
          memcmp(db, db2, C * 4) == 0);
    free(x), free(w), free(bias), free(out), free(mean), free(rstd), free(xd), free(wd), free(bd);
    free(ref), free(R), free(din), free(din0), free(dw), free(dw0), free(db), free(db0), free(g);
    free(din2), free(dw2), free(db2);
}

static void test_norm(void) {
    norm_case(false, 7, 45);
    norm_case(true, 7, 45);
    norm_case(false, 5, 64);
    norm_case(true, 3, 130);
}

/* ---------------------------------------------------------------- rope */

static void test_rope(void) {
    int N = 21, nh = 4, nkv = 2, hd = 16, row = (nh + 2 * nkv) * hd;
    float base = 10000.0f;
    int32_t pos[21];
    for (int n = 0; n < N; n++) pos[n] = (n * 7) % 300;
    float *x = kt_rand((size_t)N * row, 1.0f), *y = kt_copy(x, (size_t)N * row);
    B32->ops->rope(B32, y, pos, N, nh, nkv, hd, base, false);
    double *ref = kt_dcopy(x, (size_t)N * row);
    for (int n = 0; n < N; n++)
        for (int h = 0; h < nh + nkv; h++) /* q and k heads; v untouched */
            for (int i = 0; i < hd / 2; i++) {
                double th = pos[n] * pow(base, -2.0 * i / hd);
                size_t a = (size_t)n * row + (size_t)h * hd + i, c = a + hd / 2;
                ref[a] = x[a] * cos(th) - x[c] * sin(th);
                ref[c] = x[c] * cos(th) + x[a] * sin(th);
            }
    CHECK(kt_worst(y, ref, (size_t)N * row, 1e-5, 1e-5) <= 1);
    /* inverse undoes forward */
    B32->ops->rope(B32, y, pos, N, nh, nkv, hd, base, true);
    double *xd = kt_dcopy(x, (size_t)N * row);
    CHECK(kt_worst(y, xd, (size_t)N * row, 1e-5, 1e-5) <= 1);
    /* inverse is the backward: <rope(x), r> == <x, rope_inv(r)> */
    float *r = kt_rand((size_t)N * row, 1.0f), *rx = kt_copy(x, (size_t)N * row);
    float *ri = kt_copy(r, (size_t)N * row);
    B32->ops->rope(B32, rx, pos, N, nh, nkv, hd, base, false);
    B32->ops->rope(B32, ri, pos, N, nh, nkv, hd, base, true);
    double l1 = 0, l2 = 0;
    for (size_t i = 0; i < (size_t)N * row; i++) l1 += (double)rx[i] * r[i], l2 += (double)x[i] * ri[i];
    CHECK_CLOSE(l1, l2, 1e-4, 1e-5);
    /* and a mis-signed inverse (forward applied again) would differ */
    float *rf = kt_copy(r, (size_t)N * row);
    B32->ops->rope(B32, rf, pos, N, nh, nkv, hd, base, false);
    double l3 = 0;
    for (size_t i = 0; i < (size_t)N * row; i++) l3 += (double)x[i] * rf[i];
    CHECK(fabs(l3 - l1) > 1e-2);
    /* a larger position later grows the cached table */
    pos[0] = 5000;
    float *z = kt_copy(x, (size_t)N * row);
    B32->ops->rope(B32, z, pos, 1, nh, nkv, hd, base, false);
    double th = 5000.0 * pow(base, -2.0 * 1 / hd);
    CHECK_CLOSE(z[1], x[1] * cos(th) - x[1 + hd / 2] * sin(th), 1e-4, 0);
    free(x), free(y), free(ref), free(xd), free(r), free(rx), free(ri), free(rf), free(z);
}

/* ---------------------------------------------------------------- activations */

static double ref_gelu(double x) {
    return 0.5 * x * (1 + tanh(sqrt(2 / M_PI) * (x + 0.044715 * x * x * x)));
}

static void test_gelu(void) {
    size_t n = 40001;
    float *x = kt_rand(n, 6.0f), *y = kt_rand(n, 1);
    x[0] = 0.0f, x[1] = 30.0f, x[2] = -30.0f, x[3] = 1e-8f;
    B32->ops->gelu_forward(B32, y, x, n);
    double *r = malloc(n * sizeof(double));
    for (size_t i = 0; i < n; i++) r[i] = ref_gelu(x[i]);
    CHECK(kt_worst(y, r, n, 2e-6, 1e-5) <= 1);
    float *dout = kt_rand(n, 1), *din = kt_rand(n, 1);
    B32->ops->gelu_backward(B32, din, dout, x, n);
    for (size_t i = 0; i < n; i++) {
        double h = 1e-5;
        r[i] = dout[i] * (ref_gelu((double)x[i] + h) - ref_gelu((double)x[i] - h)) / (2 * h);
    }
    CHECK(kt_worst(din, r, n, 1e-5, 1e-4) <= 1);
    /* din may alias dout */
    float *a = kt_copy(dout, n);
    B32->ops->gelu_backward(B32, a, a, x, n);
    CHECK(memcmp(a, din, n * 4) == 0);
    free(x), free(y), free(r), free(dout), free(din), free(a);
}

static double ref_silu(double a) { return a / (1 + exp(-a)); }

static void test_swiglu(void) {
    int N = 13, F = 37;
    float *in = kt_rand((size_t)N * 2 * F, 4.0f), *out = kt_rand((size_t)N * F, 1);
    B32->ops->swiglu_forward(B32, out, in, N, F);
    double *r = malloc((size_t)N * 2 * F * sizeof(double));
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++)
            r[(size_t)n * F + i] = ref_silu(in[(size_t)n * 2 * F + i]) * in[(size_t)n * 2 * F + F + i];
    CHECK(kt_worst(out, r, (size_t)N * F, 1e-6, 1e-5) <= 1);
    float *dout = kt_rand((size_t)N * F, 1), *din = kt_rand((size_t)N * 2 * F, 9);
    B32->ops->swiglu_backward(B32, din, dout, in, N, F);
    const double h = 1e-5;
    for (int n = 0; n < N; n++)
        for (int i = 0; i < F; i++) {
            double a = in[(size_t)n * 2 * F + i], gg = in[(size_t)n * 2 * F + F + i];
            double d = dout[(size_t)n * F + i];
            r[(size_t)n * 2 * F + i] = d * gg * (ref_silu(a + h) - ref_silu(a - h)) / (2 * h);
            r[(size_t)n * 2 * F + F + i] = d * ref_silu(a);
        }
    CHECK(kt_worst(din, r, (size_t)N * 2 * F, 1e-5, 1e-4) <= 1);
    free(in), free(out), free(r), free(dout), free(din);
}

/* ---------------------------------------------------------------- elementwise */

static void test_add_scale(void) {
    size_t n = 70001;
    float *x = kt_rand(n, 1), *y = kt_rand(n, 1), *o = kt_rand(n, 1);
    B32->ops->add(B32, o, x, y, n);
    int ok = 1;
    for (size_t i = 0; i < n; i++) ok &= o[i] == x[i] + y[i];
    CHECK(ok);
    float *x2 = kt_copy(x, n);
    B32->ops->add(B32, x2, x2, y, n); /* aliasing */
    CHECK(memcmp(x2, o, n * 4) == 0);
    B32->ops->scale(B32, x2, 0.25f, n);
    ok = 1;
    for (size_t i = 0; i < n; i++) ok &= x2[i] == o[i] * 0.25f;
    CHECK(ok);
    free(x), free(y), free(o), free(x2);
}

static void test_dropout(void) {
    size_t n = 200003;
    float p = 0.3f;
    float *x = kt_rand(n, 1), *y = kt_rand(n, 1), *y2 = kt_rand(n, 1);
    B32->ops->dropout(B32, y, x, n, p, 42, 1000);
    size_t kept = 0;
    int ok = 1;
    for (size_t i = 0; i < n; i++) {
        bool k = kb_keep(42, 1000 + i, p);
        kept += k;
        ok &= y[i] == (k ? x[i] * (1.0f / (1.0f - p)) : 0.0f);
    }
    CHECK(ok);
    double frac = (double)kept / n, sd = sqrt(p * (1 - p) / n);
    CHECK_MSG(fabs(frac - (1 - p)) < 5 * sd, "kept fraction %g", frac);
    /* the mean is preserved */
    double sx = 0, sy = 0;
    for (size_t i = 0; i < n; i++) sx += fabs(x[i]), sy += fabs(y[i]);
    CHECK_CLOSE(sy / n, sx / n, 0.01, 0);
    /* replay: same seed and offset -> same mask; in place works */
    memcpy(y2, x, n * 4);
    B32->ops->dropout(B32, y2, y2, n, p, 42, 1000);
    CHECK(memcmp(y, y2, n * 4) == 0);
    /* another offset or seed -> another mask */
    B32->ops->dropout(B32, y2, x, n, p, 42, 1001);
    CHECK(memcmp(y, y2, n * 4) != 0);
    B32->ops->dropout(B32, y2, x, n, p, 43, 1000);
    CHECK(memcmp(y, y2, n * 4) != 0);
    /* offset arithmetic: a slice starting at element 17 uses offset + 17 */
    B32->ops->dropout(B32, y2, x + 17, n - 17, p, 42, 1017);
    CHECK(memcmp(y + 17, y2, (n - 17) * 4) == 0);
    /* p = 0 copies */
    B32->ops->dropout(B32, y2, x, n, 0.0f, 42, 0);
    CHECK(memcmp(x, y2, n * 4) == 0);
    /* independent bits: adjacent counters are not correlated */
    size_t both = 0;
    for (size_t i = 0; i + 1 < n; i++) both += kb_keep(7, i, 0.5f) && kb_keep(7, i + 1, 0.5f);
    CHECK(fabs((double)both / (n - 1) - 0.25) < 0.01);
    free(x), free(y), free(y2);
}

/* ---------------------------------------------------------------- cross entropy */

static void test_cross_entropy(void) {
    int N = 9, Vp = 1003;
    float *lg = kt_rand((size_t)N * Vp, 4.0f);
    for (int j = 0; j < Vp; j++) lg[(size_t)2 * Vp + j] += 80.0f; /* large logits: stable? */
    lg[(size_t)3 * Vp + 5] = 30.0f;                               /* a peaked row */
    int32_t tg[9];
    float ds[9];
    for (int n = 0; n < N; n++) tg[n] = kt_randint(Vp), ds[n] = 0.1f * (n + 1);
    tg[3] = 5;
    tg[4] = Vp - 1;
    ds[6] = 0.0f;
    float *g = kt_copy(lg, (size_t)N * Vp);
    float loss[9];
    B32->ops->cross_entropy(B32, loss, g, tg, ds, N, Vp);
    double *rg = malloc((size_t)N * Vp * sizeof(double)), rl[9];
    for (int n = 0; n < N; n++) {
        const float *x = lg + (size_t)n * Vp;
        double m = -INFINITY, s = 0;
        for (int j = 0; j < Vp; j++) m = x[j] > m ? x[j] : m;
        for (int j = 0; j < Vp; j++) s += exp(x[j] - m);
        double lse = m + log(s);
        rl[n] = lse - x[tg[n]];
        for (int j = 0; j < Vp; j++)
            rg[(size_t)n * Vp + j] = (exp(x[j] - lse) - (j == tg[n])) * ds[n];
    }
    for (int n = 0; n < N; n++) CHECK_CLOSE(loss[n], rl[n], 2e-5, 1e-5);
    CHECK(kt_worst(g, rg, (size_t)N * Vp, 1e-7, 1e-4) <= 1);
    int zero = 1;
    for (int j = 0; j < Vp; j++) zero &= g[(size_t)6 * Vp + j] == 0.0f;
    CHECK(zero);
    CHECK(loss[6] > 0.0f);
    /* gradient of a row sums to ~0 */
    double s = 0;
    for (int j = 0; j < Vp; j++) s += g[j];
    CHECK(fabs(s) < 1e-5);
    /* determinism */
    float *g2 = kt_copy(lg, (size_t)N * Vp), loss2[9];
    B32->ops->cross_entropy(B32, loss2, g2, tg, ds, N, Vp);
    CHECK(memcmp(g, g2, (size_t)N * Vp * 4) == 0 && memcmp(loss, loss2, sizeof loss) == 0);
    free(lg), free(g), free(rg), free(g2);
}

/* ---------------------------------------------------------------- optimizer */

static void test_sumsq(void) {
    size_t n = 100003;
    float *x = kt_rand(n, 3.0f);
    double r = 0;
    for (size_t i = 0; i < n; i++) r += (double)x[i] * x[i];
    double s = B32->ops->sumsq(B32, x, n);
    CHECK_CLOSE(s, r, 0, 1e-12);
    CHECK(B32->ops->sumsq(B32, x, n) == s);
    CHECK(B32->ops->sumsq(B32, x, 0) == 0.0);
    CHECK_CLOSE(B32->ops->sumsq(B32, x, 3), (double)x[0] * x[0] + (double)x[1] * x[1] + (double)x[2] * x[2], 0, 1e-15);
    free(x);
}

static void test_adamw(void) {
    size_t n = 33333;
    float *p = kt_rand(n, 1), *m = kt_rand(n, 0.01f), *v = kt_rand(n, 0.01f);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    double *rp = kt_dcopy(p, n), *rm = kt_dcopy(m, n), *rv = kt_dcopy(v, n);
    const float lr = 1e-3f, b1 = 0.9f, b2 = 0.95f, eps = 1e-8f, wd = 0.1f, gs = 0.5f;
    for (int t = 1; t <= 3; t++) {
        float *g = kt_rand(n, 1);
        B32->ops->adamw(B32, p, g, m, v, n, lr, b1, b2, eps, wd, gs, t);
        double bc1 = 1 - pow(b1, t), bc2 = 1 - pow(b2, t);
        for (size_t i = 0; i < n; i++) {
            double gi = (double)g[i] * gs;
            rm[i] = b1 * rm[i] + (1 - b1) * gi;
            rv[i] = b2 * rv[i] + (1 - b2) * gi * gi;
            double mh = rm[i] / bc1, vh = rv[i] / bc2;
            rp[i] -= lr * (mh / (sqrt(vh) + eps) + wd * rp[i]);
        }
        free(g);
    }
    CHECK(kt_worst(m, rm, n, 1e-7, 1e-5) <= 1);
    CHECK(kt_worst(v, rv, n, 1e-9, 1e-5) <= 1);
    CHECK(kt_worst(p, rp, n, 1e-6, 1e-6) <= 1);
    free(p), free(m), free(v), free(rp), free(rm), free(rv);
}

/* AdamW with the weights' checksum: bitwise the same step as adamw, and the checksum of
 * what it wrote equals a separate pass of kb_checksum_f32 (blocks hashed in any order, on
 * any thread); one flipped bit anywhere changes it. */
static void test_adamw_checksum(void) {
    size_t n = 3 * KB_SUM_BLOCK + 1234;
    float *p = kt_rand(n, 1), *m = kt_rand(n, 0.01f), *v = kt_rand(n, 0.01f), *g = kt_rand(n, 1);
    for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
    float *p2 = malloc(n * sizeof *p2), *m2 = malloc(n * sizeof *m2), *v2 = malloc(n * sizeof *v2);
    REQUIRE(p2 && m2 && v2);
    memcpy(p2, p, n * sizeof *p), memcpy(m2, m, n * sizeof *m), memcpy(v2, v, n * sizeof *v);
    REQUIRE(B32->ops->adamw_checksum != NULL);
    uint64_t sum = 0;
    B32->ops->adamw(B32, p, g, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 2);
    B32->ops->adamw_checksum(B32, p2, g, m2, v2, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.5f, 2, 77, &sum);
    CHECK(!memcmp(p, p2, n * sizeof *p) && !memcmp(m, m2, n * sizeof *m) && !memcmp(v, v2, n * sizeof *v));
    CHECK(sum == kb_checksum_f32(p, n, 77));
    CHECK(sum != kb_checksum_f32(p, n, 78));
    uint64_t by_blocks = 0;
    for (size_t b = 4; b-- > 0;) /* the blocks in reverse order */
        by_blocks ^= kb_checksum_block(p + b * KB_SUM_BLOCK, b == 3 ? 1234 : KB_SUM_BLOCK, 77, b);
    CHECK(by_blocks == sum);
    size_t where[] = {0, KB_SUM_BLOCK - 1, KB_SUM_BLOCK, n - 1};
    for (int k = 0; k < 4; k++)
        for (int bit = 0; bit < 32; bit += 7) {
            uint32_t u;
            memcpy(&u, &p[where[k]], 4);
            u ^= 1u << bit;
            memcpy(&p2[where[k]], &u, 4);
            CHECK(kb_checksum_f32(p2, n, 77) != sum);
            memcpy(&p2[where[k]], &p[where[k]], 4);
        }
    CHECK(kb_checksum_f32(p2, n, 77) == sum);
    free(p), free(m), free(v), free(g), free(p2), free(m2), free(v2);
}

/* ---------------------------------------------------------------- grouped products */

/* Groups of 0, 1, 63, 64, 65 and 200 rows after 5 leading rows (off[0] = 5): each group's
 * forward, input gradient and weight gradient against double loops, and the same bits on 1
 * and 2 threads (the pieces do not depend on the thread count). */
static void test_grouped_linear(void) {
    enum { NG = 6, IC = 24, OC = 70, LEAD = 5 };
    static const int rows[NG] = {0, 1, 63, 64, 65, 200};
    int32_t off[NG + 1];
    off[0] = LEAD;
    for (int g = 0; g < NG; g++) off[g + 1] = off[g] + rows[g];
    int N = off[NG];
    kb_backend *b1 = kt_backend(1, false);
    REQUIRE(b1 && B32->ops->grouped_linear_forward && B32->ops->grouped_linear_backward);
    float *in = kt_rand((size_t)N * IC, 1.0f), *W = kt_rand((size_t)NG * OC * IC, 0.5f);
    float *dout = kt_rand((size_t)N * OC, 1.0f), *dW0 = kt_rand((size_t)NG * OC * IC, 1.0f);
    float *out[2], *din[2], *dW[2];
    kb_backend *bs[2] = {b1, B32};
    for (int k = 0; k < 2; k++) {
        out[k] = kt_rand((size_t)N * OC, 3.0f);
        din[k] = kt_rand((size_t)N * IC, 3.0f);
        dW[k] = kt_copy(dW0, (size_t)NG * OC * IC);
        bs[k]->ops->grouped_linear_forward(bs[k], out[k], in, W, off, NG, IC, OC);
        bs[k]->ops->grouped_linear_backward(bs[k], din[k], dW[k], dout, in, W, off, NG, IC, OC);
        CHECK(bs[k]->status == 0);
    }
    double *r = malloc(sizeof(double) * (size_t)N * (OC > IC ? OC : IC));
    double *rw = malloc(sizeof(double) * (size_t)NG * OC * IC);
    for (int g = 0; g < NG; g++) {
        const float *Wg = W + (size_t)g * OC * IC;
        for (int n = off[g]; n < off[g + 1]; n++) {
            for (int o = 0; o < OC; o++) {
                double s = 0;
                for (int i = 0; i < IC; i++) s += (double)in[(size_t)n * IC + i] * Wg[(size_t)o * IC + i];
                r[(size_t)n * OC + o] = s;
            }
        }
    }
    CHECK_MSG(kt_worst(out[1] + (size_t)LEAD * OC, r + (size_t)LEAD * OC, (size_t)(N - LEAD) * OC, 1e-4, 1e-4) <= 1.0,
              "grouped forward");
    for (int g = 0; g < NG; g++) {
        const float *Wg = W + (size_t)g * OC * IC;
        for (int n = off[g]; n < off[g + 1]; n++)
            for (int i = 0; i < IC; i++) {
                double s = 0;
                for (int o = 0; o < OC; o++) s += (double)dout[(size_t)n * OC + o] * Wg[(size_t)o * IC + i];
                r[(size_t)n * IC + i] = s;
            }
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < IC; i++) {
                double s = dW0[((size_t)g * OC + o) * IC + i];
                for (int n = off[g]; n < off[g + 1]; n++) s += (double)dout[(size_t)n * OC + o] * in[(size_t)n * IC + i];
                rw[((size_t)g * OC + o) * IC + i] = s;
            }
    }
    CHECK_MSG(kt_worst(din[1] + (size_t)LEAD * IC, r + (size_t)LEAD * IC, (size_t)(N - LEAD) * IC, 1e-4, 1e-4) <= 1.0,
              "grouped input gradient");
    CHECK_MSG(kt_worst(dW[1], rw, (size_t)NG * OC * IC, 1e-4, 1e-4) <= 1.0, "grouped weight gradient");
    /* rows before off[0] untouched, group 0 (empty) weights' gradient untouched */
    CHECK(!memcmp(dW[1], dW0, sizeof(float) * OC * IC));
    CHECK_MSG(!memcmp(out[0] + (size_t)LEAD * OC, out[1] + (size_t)LEAD * OC, sizeof(float) * (size_t)(N - LEAD) * OC) &&
                  !memcmp(din[0] + (size_t)LEAD * IC, din[1] + (size_t)LEAD * IC,
                          sizeof(float) * (size_t)(N - LEAD) * IC) &&
                  !memcmp(dW[0], dW[1], sizeof(float) * (size_t)NG * OC * IC),
              "grouped products differ between 1 and 2 threads");
    for (int k = 0; k < 2; k++) free(out[k]), free(din[k]), free(dW[k]);
    free(in), free(W), free(dout), free(dW0), free(r), free(rw);
    kb_backend_destroy(&b1);
}

int main(void) {
    B32 = kt_backend(2, false);
    B16 = kb_cpu_bf16_check(NULL, 0) ? kt_backend(2, true) : NULL;
    RUN(test_backend_new);
    RUN(test_bf16_choice);
    RUN(test_zero_to_bf16);
    RUN(test_linear_fp32);
    RUN(test_linear_bf16);
    RUN(test_linear_fp16);
    RUN(test_grouped_linear);
    RUN(test_embed);
    RUN(test_norm);
    RUN(test_rope);
    RUN(test_gelu);
    RUN(test_swiglu);
    RUN(test_add_scale);
    RUN(test_dropout);
    RUN(test_cross_entropy);
    RUN(test_sumsq);
    RUN(test_adamw);
    RUN(test_adamw_checksum);
    kb_backend_destroy(&B32);
    kb_backend_destroy(&B16);
    return TEST_EXIT();
}
