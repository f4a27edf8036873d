/* test_gpu_grouped.c - the CUDA backend's grouped products (kb_ops.grouped_linear_forward and
 * grouped_linear_backward, kernels/cuda/cuda_grouped.cu: the MoE experts with
 * --moe-grouped-gemm) against a host reference computed in double, on uneven groups with
 * empty ones and off[0] > 0:
 *   - out and din within the fp32 (bf16) tolerances of test_gpu_kernels.c's linear cases (the
 *     bf16 reference is computed from the bf16-rounded inputs);
 *   - dW ACCUMULATES into its previous contents; an empty group's dW is bitwise unchanged;
 *   - rows outside [off[0], off[n]) of out and din are never written (sentinels stay);
 *   - din = NULL and dW = NULL skip their part; all groups empty writes nothing;
 *   - two runs bitwise equal.
 * Three CUDA backends: the default (cublasGemmGroupedBatchedEx where cuBLAS has it), one made
 * with COHORT_TEST_CUDA_GROUPED_LOOP=1 (one cublasSgemm per group, the path of toolkits
 * before 12.5) and a bf16 one (per-group cuBLASLt bf16 products). Exits 77 without a GPU. */
#include "tests/gpu/gpu_util.h"

#include <math.h>

#define SENTINEL 1234.5f

typedef struct gcase {
    int n, IC, OC, pre, post; /* n groups; rows [0, pre) and the post rows after off[n] belong to none */
    const int *rows;          /* rows of each group */
} gcase;

/* host reference in double */
static void reference(const gcase *c, const int32_t *off, const float *in, const float *W, const float *dout,
                      float *out, float *din, float *dW) {
    int IC = c->IC, OC = c->OC;
    for (int j = 0; j < c->n; j++) {
        const float *Wj = W + (size_t)j * OC * IC;
        for (int r = off[j]; r < off[j + 1]; r++) {
            for (int o = 0; o < OC; o++) {
                double s = 0;
                for (int i = 0; i < IC; i++) s += (double)in[(size_t)r * IC + i] * Wj[(size_t)o * IC + i];
                out[(size_t)r * OC + o] = (float)s;
            }
            for (int i = 0; i < IC; i++) {
                double s = 0;
                for (int o = 0; o < OC; o++) s += (double)dout[(size_t)r * OC + o] * Wj[(size_t)o * IC + i];
                din[(size_t)r * IC + i] = (float)s;
            }
        }
        for (int o = 0; o < OC; o++)
            for (int i = 0; i < IC; i++) {
                if (off[j + 1] <= off[j]) continue; /* untouched: compared bitwise below */
                double s = dW[((size_t)j * OC + o) * IC + i];
                for (int r = off[j]; r < off[j + 1]; r++) s += (double)dout[(size_t)r * OC + o] * in[(size_t)r * IC + i];
                dW[((size_t)j * OC + o) * IC + i] = (float)s;
            }
    }
}

/* round-to-nearest-even bf16, back in a float (the inputs a bf16 product sees) */
static float *bf16_copy(const float *x, size_t n) {
    float *y = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) {
        uint32_t u;
        memcpy(&u, &x[i], 4);
        u = (u + 0x7fffu + ((u >> 16) & 1u)) & 0xffff0000u;
        memcpy(&y[i], &u, 4);
    }
    return y;
}

static float *filled(size_t n, float v) {
    float *x = malloc((n ? n : 1) * sizeof(float));
    for (size_t i = 0; i < n; i++) x[i] = v;
    return x;
}

/* rows outside the groups bitwise SENTINEL, rows inside close to ref */
static void check_rows(const char *label, const gcase *c, const int32_t *off, const float *got, const float *ref,
                       int width, double atol, double rtol) {
    int total = off[c->n] + c->post;
    bool kept = true;
    for (int r = 0; r < total; r++) {
        if (r >= off[0] && r < off[c->n]) continue;
        for (int k = 0; k < width; k++) kept &= got[(size_t)r * width + k] == SENTINEL;
    }
    CHECK_MSG(kept, "%s: a row outside the groups was written", label);
    size_t a = (size_t)off[0] * width, m = (size_t)(off[c->n] - off[0]) * width;
    if (m) GU_CLOSE(label, got + a, ref + a, m, atol, rtol);
}

/* one case on backend G; returns the GPU's out, din and dW (host copies) for the repeat check */
static void run_case(kb_backend *G, const char *name, const gcase *c, double tol, bool bf16, float **res) {
    const kb_ops *o = G->ops;
    int n = c->n, IC = c->IC, OC = c->OC;
    int32_t *off = malloc(sizeof(int32_t) * (size_t)(n + 1));
    off[0] = c->pre;
    for (int j = 0; j < n; j++) off[j + 1] = off[j] + c->rows[j];
    int Nt = off[n] + c->post;
    size_t nin = (size_t)Nt * IC, nout = (size_t)Nt * OC, nw = (size_t)n * OC * IC;
    float *in = gu_rand(nin, 1.0f), *W = gu_rand(nw, 0.5f), *dout = gu_rand(nout, 1.0f), *dW0 = gu_rand(nw, 0.1f);
    float *out = filled(nout, SENTINEL), *din = filled(nin, SENTINEL), *dW = malloc(sizeof(float) * (nw ? nw : 1));
    memcpy(dW, dW0, sizeof(float) * nw);
    if (bf16) { /* the reference from the bf16-rounded inputs the GPU multiplies */
        float *r_in = bf16_copy(in, nin), *r_W = bf16_copy(W, nw), *r_dout = bf16_copy(dout, nout);
        reference(c, off, r_in, r_W, r_dout, out, din, dW);
        free(r_in), free(r_W), free(r_dout);
    } else {
        reference(c, off, in, W, dout, out, din, dW);
    }

    float *gin = gu_buf(G, in, nin), *gW = gu_buf(G, W, nw), *gdout = gu_buf(G, dout, nout);
    float *gout = gu_buf(G, NULL, nout), *gdin = gu_buf(G, NULL, nin), *gdW = gu_buf(G, dW0, nw);
    float *sent_out = filled(nout, SENTINEL), *sent_in = filled(nin, SENTINEL);
    o->copy(G, gout, sent_out, sizeof(float) * nout);
    o->copy(G, gdin, sent_in, sizeof(float) * nin);
    o->grouped_linear_forward(G, gout, gin, gW, off, n, IC, OC);
    o->grouped_linear_backward(G, gdin, gdW, gdout, gin, gW, off, n, IC, OC);
    o->sync(G);
    CHECK_MSG(G->status == 0, "%s: status %d %s", name, G->status, co_err_detail());
    char l[160];
    float *h_out = gu_fetch(G, gout, nout), *h_din = gu_fetch(G, gdin, nin), *h_dW = gu_fetch(G, gdW, nw);
    snprintf(l, sizeof l, "%s out", name);
    check_rows(l, c, off, h_out, out, OC, tol * IC / 16 + tol, tol);
    snprintf(l, sizeof l, "%s din", name);
    check_rows(l, c, off, h_din, din, IC, tol * OC / 16 + tol, tol);
    int maxrows = 1;
    for (int j = 0; j < n; j++) maxrows = c->rows[j] > maxrows ? c->rows[j] : maxrows;
    for (int j = 0; j < n; j++) {
        size_t a = (size_t)j * OC * IC, m = (size_t)OC * IC;
        snprintf(l, sizeof l, "%s dW group %d (%d rows)", name, j, c->rows[j]);
        if (c->rows[j] == 0) GU_EQUAL(l, h_dW + a, dW0 + a, m * sizeof(float));
        else GU_CLOSE(l, h_dW + a, dW + a, m, tol * maxrows / 16 + tol, tol);
    }

    /* din = NULL: only dW (accumulated once more from the same start); dW = NULL: only din */
    float *gdW2 = gu_buf(G, dW0, nw), *gdin2 = gu_buf(G, sent_in, nin);
    o->grouped_linear_backward(G, NULL, gdW2, gdout, gin, gW, off, n, IC, OC);
    o->grouped_linear_backward(G, gdin2, NULL, gdout, gin, gW, off, n, IC, OC);
    float *h_dW2 = gu_fetch(G, gdW2, nw), *h_din2 = gu_fetch(G, gdin2, nin);
    snprintf(l, sizeof l, "%s dW without din", name);
    GU_EQUAL(l, h_dW2, h_dW, nw * sizeof(float));
    snprintf(l, sizeof l, "%s din without dW", name);
    GU_EQUAL(l, h_din2, h_din, nin * sizeof(float));

    /* every group empty: nothing written */
    int32_t *off0 = malloc(sizeof(int32_t) * (size_t)(n + 1));
    for (int j = 0; j <= n; j++) off0[j] = c->pre;
    float *gout3 = gu_buf(G, sent_out, nout), *gdW3 = gu_buf(G, dW0, nw);
    o->grouped_linear_forward(G, gout3, gin, gW, off0, n, IC, OC);
    o->grouped_linear_backward(G, gdin2, gdW3, gdout, gin, gW, off0, n, IC, OC);
    float *h_out3 = gu_fetch(G, gout3, nout), *h_dW3 = gu_fetch(G, gdW3, nw), *h_din3 = gu_fetch(G, gdin2, nin);
    snprintf(l, sizeof l, "%s all groups empty", name);
    CHECK_MSG(memcmp(h_out3, sent_out, nout * sizeof(float)) == 0 && memcmp(h_dW3, dW0, nw * sizeof(float)) == 0 &&
                  memcmp(h_din3, h_din, nin * sizeof(float)) == 0,
              "%s: something was written", l);
    CHECK_MSG(G->status == 0, "%s: status %d %s", name, G->status, co_err_detail());

    res[0] = h_out, res[1] = h_din, res[2] = h_dW;
    float *gp[] = {gin, gW, gdout, gout, gdin, gdW, gdW2, gdin2, gout3, gdW3};
    for (size_t i = 0; i < sizeof gp / sizeof gp[0]; i++) o->free(G, gp[i]);
    free(in), free(W), free(dout), free(dW0), free(out), free(din), free(dW), free(sent_out), free(sent_in);
    free(h_dW2), free(h_din2), free(h_out3), free(h_dW3), free(h_din3), free(off), free(off0);
}

static const int ROWS_A[] = {5, 0, 37, 1, 0, 130, 64};
static const int ROWS_B[] = {0, 17, 3, 0};
static const gcase CASES[] = {
    {7, 48, 80, 3, 5, ROWS_A},  /* 7 experts, two empty, 0..130 rows, off[0] = 3 */
    {4, 33, 17, 0, 2, ROWS_B},  /* odd widths: rows start at unaligned addresses; first group empty */
    {7, 96, 64, 0, 0, ROWS_A},
};
#define NCASES (int)(sizeof CASES / sizeof CASES[0])

/* every case twice on G: the reference checks, then the repeat bitwise */
static void run_all(kb_backend *G, const char *kind, double tol, bool bf16) {
    for (int k = 0; k < NCASES; k++) {
        char name[96];
        snprintf(name, sizeof name, "%s case %d (n %d, IC %d, OC %d)", kind, k, CASES[k].n, CASES[k].IC, CASES[k].OC);
        uint64_t rng = gu__rng;
        float *a[3], *b[3];
        run_case(G, name, &CASES[k], tol, bf16, a);
        gu__rng = rng; /* the same inputs again */
        run_case(G, name, &CASES[k], tol, bf16, b);
        int Nt = CASES[k].pre + CASES[k].post;
        for (int j = 0; j < CASES[k].n; j++) Nt += CASES[k].rows[j];
        size_t sz[3] = {(size_t)Nt * CASES[k].OC, (size_t)Nt * CASES[k].IC, (size_t)CASES[k].n * CASES[k].OC * CASES[k].IC};
        CHECK_MSG(memcmp(a[0], b[0], sz[0] * 4) == 0 && memcmp(a[1], b[1], sz[1] * 4) == 0 &&
                      memcmp(a[2], b[2], sz[2] * 4) == 0,
                  "%s: two runs differ", name);
        for (int i = 0; i < 3; i++) free(a[i]), free(b[i]);
    }
}

static void test_grouped_default(void) {
    kb_backend *G = gu_backend(KB_DEVICE_CUDA, false);
    REQUIRE(G->ops->grouped_linear_forward && G->ops->grouped_linear_backward);
    run_all(G, "fp32 grouped", 1e-4, false);
    kb_backend_destroy(&G);
}

static void test_grouped_loop(void) {
    /* read when the backend makes its cuBLAS handle (first grouped call) */
    setenv("COHORT_TEST_CUDA_GROUPED_LOOP", "1", 1);
    kb_backend *G = gu_backend(KB_DEVICE_CUDA, false);
    run_all(G, "fp32 per-group loop", 1e-4, false);
    kb_backend_destroy(&G);
    unsetenv("COHORT_TEST_CUDA_GROUPED_LOOP");
}

static void test_grouped_bf16(void) {
    kb_backend *G = gu_backend(KB_DEVICE_CUDA, true);
    run_all(G, "bf16", 2e-3, true);
    kb_backend_destroy(&G);
}

int main(void) {
    gu_require_gpu();
    RUN(test_grouped_default);
    RUN(test_grouped_loop);
    RUN(test_grouped_bf16);
    return TEST_EXIT();
}
