/* test_gpu_kernels.c - every entry of kb_backend (kernels/backend.h) on the CUDA backend
 * against the CPU backend, on fresh random inputs (never zeros), at shapes that cross every
 * tile boundary of the kernels: attention at 1, 31, 32, 33, 130 and 1000 tokens (the 32-row
 * tiles), head dimensions 2 to 128 (each register width E), grouped queries, document masks
 * on and off, dropout; in bf16 mode the tensor-core attention (head dimensions 64 and 128)
 * at 1, 15, 16, 17, 64, 100 and 129 tokens (its 16-row fragments and 32-row tiles), bitwise
 * repeatable; linear layers with and without bias (an aligned and a misaligned bias
 * pointer: the cuBLASLt heuristic's alignment); the fused GELU products (cuBLASLt
 * epilogues, and their fallback); odd vocabularies; grouped products with empty
 * groups; the tensor-parallel entries with a repeat-run bitwise check. fp32 and bf16
 * tolerances; the CPU's bf16 reference takes bf16 on any CPU (kb_options.bf16_reference).
 * Every entry is set on CUDA too; block attention (context parallelism) is checked with the
 * queries the upper halves of a packed buffer's sequences, causal and unmasked blocks, with
 * and without document ids (rows that see no key: lse -inf), dq/dk/dv accumulated; the ring's
 * LSE merge, strided copies and bf16 widening bitwise the CPU's on the stand-in, with no
 * host wait.
 * On a GPU (suite gpu) it exits 77 without one, and uses GPT-2-sized shapes too. On the CUDA
 * stand-in (tests/cudasim/: the real kernels/cuda sources on the CPU, loaded as the module
 * libcohort_cudasim.so through COHORT_CUDA_MODULE; suite cudasim) COHORT_TEST_STANDIN=1 makes
 * a missing module a failure, not a skip, and keeps the shapes small (the stand-in runs every
 * CUDA thread as a fiber); COHORT_CUDASIM_SEED varies the thread order per run.
 * The weights' checksum and the gradient norm's runs are checked bit for bit against the
 * host (kernels/checksum.c, sumsq per run), and on the stand-in each with one host wait;
 * copy_rows bitwise against the CPU's and the host's, with none. */
#include "tests/gpu/gpu_util.h"

#include "kernels/checksum.h"

#include <dlfcn.h>
#include <math.h>

static kb_backend *CPU32, *CPU16, *GPU32, *GPU16;
static bool BIG; /* a real GPU: GPT-2-sized shapes too */

/* ---------------------------------------------------------------- memory, bf16 */

static void test_memory(void) {
    size_t n = 100003;
    float *x = gu_rand(n, 7.0f);
    x[5] = NAN;
    x[6] = INFINITY;
    x[7] = -0.0f;
    float *d = gu_buf(GPU32, x, n);
    float *back = gu_fetch(GPU32, d, n);
    GU_EQUAL("copy round trip", back, x, n * sizeof(float));
    uint16_t *c16 = malloc(n * 2), *g16h = malloc(n * 2);
    CPU32->ops->to_bf16(CPU32, c16, x, n);
    uint16_t *g16 = GPU32->ops->alloc(GPU32, n * 2);
    GPU32->ops->to_bf16(GPU32, g16, d, n);
    GPU32->ops->copy(GPU32, g16h, g16, n * 2);
    GU_EQUAL("to_bf16", g16h, c16, n * 2);
    GPU32->ops->zero(GPU32, d + 3, n - 10);
    free(back);
    back = gu_fetch(GPU32, d, n);
    int ok = back[0] == x[0] && back[2] == x[2] && back[n - 7] == x[n - 7];
    for (size_t i = 3; i < n - 7; i++) ok &= back[i] == 0.0f;
    CHECK_MSG(ok, "zero touched the wrong range");
    GPU32->ops->free(GPU32, d);
    GPU32->ops->free(GPU32, g16);
    free(x), free(back), free(c16), free(g16h);
    CHECK(GPU32->status == 0);
}

/* ---------------------------------------------------------------- linear */

/* bias_off: the bias (and its gradient) start that many floats into their allocation, so the
 * pointer is only 4- or 8-byte aligned (parameters packed in one buffer are) */
static void linear_case(bool bf16, int N, int IC, int OC, bool bias, bool pass16, int bias_off) {
    kb_backend *C = bf16 ? CPU16 : CPU32, *G = bf16 ? GPU16 : GPU32;
    char label[160];
    snprintf(label, sizeof label, "linear %s N=%d IC=%d OC=%d bias=%d (+%d floats) W16=%d", bf16 ? "bf16" : "fp32", N,
             IC, OC, bias, bias_off, pass16);
    float *in = gu_rand((size_t)N * IC, 1.0f), *W = gu_rand((size_t)OC * IC, 0.5f), *b = gu_rand(OC, 1.0f);
    float *dout = gu_rand((size_t)N * OC, 1.0f), *dW0 = gu_rand((size_t)OC * IC, 0.1f), *db0 = gu_rand(OC, 0.1f);
    uint16_t *W16 = malloc((size_t)OC * IC * 2);
    C->ops->to_bf16(C, W16, W, (size_t)OC * IC);
    /* CPU reference */
    float *out = malloc(sizeof(float) * N * OC), *din = malloc(sizeof(float) * N * IC);
    float *dW = malloc(sizeof(float) * OC * IC), *db = malloc(sizeof(float) * OC);
    memcpy(dW, dW0, sizeof(float) * OC * IC);
    memcpy(db, db0, sizeof(float) * OC);
    C->ops->linear_forward(C, out, in, W, pass16 ? W16 : NULL, bias ? b : NULL, N, IC, OC);
    C->ops->linear_backward(C, din, dW, bias ? db : NULL, dout, in, W, pass16 ? W16 : NULL, N, IC, OC);
    /* GPU */
    float *gin = gu_buf(G, in, (size_t)N * IC), *gW = gu_buf(G, W, (size_t)OC * IC);
    float *gb_mem = gu_buf(G, NULL, (size_t)OC + bias_off), *gb = gb_mem + bias_off;
    G->ops->copy(G, gb, b, sizeof(float) * OC);
    float *gdout = gu_buf(G, dout, (size_t)N * OC), *gdW = gu_buf(G, dW0, (size_t)OC * IC);
    float *gdb_mem = gu_buf(G, NULL, (size_t)OC + bias_off), *gdb = gdb_mem + bias_off;
    G->ops->copy(G, gdb, db0, sizeof(float) * OC);
    float *gout = gu_buf(G, NULL, (size_t)N * OC), *gdin = gu_buf(G, NULL, (size_t)N * IC);
    uint16_t *gW16 = G->ops->alloc(G, (size_t)OC * IC * 2);
    G->ops->to_bf16(G, gW16, gW, (size_t)OC * IC);
    G->ops->linear_forward(G, gout, gin, gW, pass16 ? gW16 : NULL, bias ? gb : NULL, N, IC, OC);
    G->ops->linear_backward(G, gdin, gdW, bias ? gdb : NULL, gdout, gin, gW, pass16 ? gW16 : NULL, N, IC, OC);
    G->ops->sync(G);
    CHECK_MSG(G->status == 0, "%s: status %d %s", label, G->status, co_err_detail());
    kb_backend_clear_status(G); /* the next cases run (and report) on their own */
    double at = bf16 ? 2e-3 : 1e-4, rt = bf16 ? 2e-3 : 1e-4;
    float *h;
    char l2[200];
    snprintf(l2, sizeof l2, "%s out", label);
    h = gu_fetch(G, gout, (size_t)N * OC);
    GU_CLOSE(l2, h, out, (size_t)N * OC, at * IC / 16 + at, rt);
    free(h);
    snprintf(l2, sizeof l2, "%s din", label);
    h = gu_fetch(G, gdin, (size_t)N * IC);
    GU_CLOSE(l2, h, din, (size_t)N * IC, at * OC / 16 + at, rt);
    free(h);
    snprintf(l2, sizeof l2, "%s dW", label);
    h = gu_fetch(G, gdW, (size_t)OC * IC);
    GU_CLOSE(l2, h, dW, (size_t)OC * IC, at * N / 16 + at, rt);
    free(h);
    if (bias) {
        /* the bias gradient is the weight-gradient product's BGRADB epilogue: the column sums
         * of dout as the product reads it, so in bf16 mode of the bf16-rounded dout (the
         * CPU's column sums of the fp32 dout are a looser match, checked too) */
        snprintf(l2, sizeof l2, "%s dbias", label);
        h = gu_fetch(G, gdb, OC);
        float *ref = db;
        if (bf16) {
            uint16_t *d16 = malloc((size_t)N * OC * 2);
            float *dr = malloc(sizeof(float) * N * OC);
            ref = malloc(sizeof(float) * OC);
            C->ops->to_bf16(C, d16, dout, (size_t)N * OC);
            for (size_t i = 0; i < (size_t)N * OC; i++) {
                uint32_t u = (uint32_t)d16[i] << 16;
                memcpy(&dr[i], &u, 4);
            }
            memcpy(ref, db0, sizeof(float) * OC);
            C->ops->bias_grad(C, ref, dr, N, OC);
            GU_CLOSE(l2, h, db, OC, 4e-3 * sqrt((double)N) + 1e-5, 4e-3); /* 2^-9 per element */
            free(d16), free(dr);
        }
        GU_CLOSE(l2, h, ref, OC, 1e-4 * N / 16 + 1e-5, 1e-4);
        if (ref != db) free(ref);
        free(h);
    }
    float *gp[] = {gin, gW, gb_mem, gdout, gdW, gdb_mem, gout, gdin};
    for (int i = 0; i < 8; i++) G->ops->free(G, gp[i]);
    G->ops->free(G, gW16);
    free(in), free(W), free(b), free(dout), free(dW0), free(db0), free(W16), free(out), free(din), free(dW), free(db);
}

/* the stand-in's count of kernel launches (cudasim_launch_count), or NULL on a GPU */
static unsigned long (*launch_count)(void);

/* The fused products (cuBLASLt's GELU epilogues): linear_gelu_forward against the CPU's
 * linear_forward + gelu_forward, linear_backward_dgelu against linear_backward (din) +
 * gelu_backward + bias_grad. F (the GELU layer's width) a multiple of 8 takes the epilogues
 * (on the stand-in: the forward launches no kernel, the backward one, the bias gradient's
 * add); otherwise the fallback (product, then the elementwise kernels). */
static void linear_gelu_case(bool bf16, int N, int IC, int F) {
    kb_backend *C = bf16 ? CPU16 : CPU32, *G = bf16 ? GPU16 : GPU32;
    char label[128];
    snprintf(label, sizeof label, "linear+gelu %s N=%d IC=%d F=%d", bf16 ? "bf16" : "fp32", N, IC, F);
    /* forward: pre[N,F] = in[N,IC] W1[F,IC]^T + b1; act = gelu(pre). backward: the next
     * layer W2[IC,F] (out width IC) gives dact = dy[N,IC] W2, dpre = dact * gelu'(pre) */
    float *in = gu_rand((size_t)N * IC, 1.0f), *W1 = gu_rand((size_t)F * IC, 0.5f), *b1 = gu_rand(F, 1.0f);
    float *W2 = gu_rand((size_t)IC * F, 0.5f), *dy = gu_rand((size_t)N * IC, 1.0f), *db0 = gu_rand(F, 0.1f);
    float *pre = malloc(sizeof(float) * N * F), *act = malloc(sizeof(float) * N * F);
    float *dpre = malloc(sizeof(float) * N * F), *db = malloc(sizeof(float) * F);
    memcpy(db, db0, sizeof(float) * F);
    C->ops->linear_forward(C, pre, in, W1, NULL, b1, N, IC, F);
    C->ops->gelu_forward(C, act, pre, (size_t)N * F);
    C->ops->linear_backward(C, dpre, NULL, NULL, dy, NULL, W2, NULL, N, F, IC);
    C->ops->gelu_backward(C, dpre, dpre, pre, (size_t)N * F);
    C->ops->bias_grad(C, db, dpre, N, F);
    float *gin = gu_buf(G, in, (size_t)N * IC), *gW1 = gu_buf(G, W1, (size_t)F * IC), *gb1 = gu_buf(G, b1, F);
    float *gW2 = gu_buf(G, W2, (size_t)IC * F), *gdy = gu_buf(G, dy, (size_t)N * IC), *gdb = gu_buf(G, db0, F);
    float *gpre = gu_buf(G, NULL, (size_t)N * F), *gact = gu_buf(G, NULL, (size_t)N * F);
    float *gdpre = gu_buf(G, NULL, (size_t)N * F);
    G->ops->sync(G);
    const bool epi = F % 8 == 0;
    unsigned long l0 = launch_count ? launch_count() : 0;
    G->ops->linear_gelu_forward(G, gact, gpre, gin, gW1, NULL, gb1, N, IC, F);
    G->ops->sync(G); /* the stand-in counts a kernel when it runs */
    unsigned long l1 = launch_count ? launch_count() : 0;
    G->ops->linear_backward_dgelu(G, gdpre, gdb, gdy, gW2, NULL, gpre, N, F, IC);
    G->ops->sync(G);
    unsigned long l2c = launch_count ? launch_count() : 0;
    CHECK_MSG(G->status == 0, "%s: status %d %s", label, G->status, co_err_detail());
    kb_backend_clear_status(G);
    if (launch_count && !bf16) { /* bf16 adds its conversion kernels */
        CHECK_MSG(epi ? l1 == l0 : l1 > l0, "%s: the forward launched %lu kernels (epilogue %d)", label, l1 - l0, epi);
        CHECK_MSG(epi ? l2c - l1 == 1 : l2c - l1 >= 2, "%s: the backward launched %lu kernels (epilogue %d)", label,
                  l2c - l1, epi);
    }
    double at = bf16 ? 2e-3 : 1e-4, rt = bf16 ? 4e-3 : 1e-4;
    char l2[200];
    float *h;
    snprintf(l2, sizeof l2, "%s pre", label);
    h = gu_fetch(G, gpre, (size_t)N * F);
    GU_CLOSE(l2, h, pre, (size_t)N * F, at * IC / 16 + at, rt);
    free(h);
    snprintf(l2, sizeof l2, "%s act", label);
    h = gu_fetch(G, gact, (size_t)N * F);
    GU_CLOSE(l2, h, act, (size_t)N * F, at * IC / 16 + at, rt);
    free(h);
    snprintf(l2, sizeof l2, "%s dpre", label);
    h = gu_fetch(G, gdpre, (size_t)N * F);
    GU_CLOSE(l2, h, dpre, (size_t)N * F, at * IC / 16 + at, rt);
    free(h);
    snprintf(l2, sizeof l2, "%s dbias", label);
    h = gu_fetch(G, gdb, F);
    GU_CLOSE(l2, h, db, F, (at * IC / 16 + at) * N / 8 + 1e-5, rt);
    free(h);
    float *gp[] = {gin, gW1, gb1, gW2, gdy, gdb, gpre, gact, gdpre};
    for (int i = 0; i < 9; i++) G->ops->free(G, gp[i]);
    free(in), free(W1), free(b1), free(W2), free(dy), free(db0), free(pre), free(act), free(dpre), free(db);
}

static void test_linear_gelu(void) {
    const char *mod = getenv("COHORT_CUDA_MODULE");
    void *hm = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (hm) *(void **)&launch_count = dlsym(hm, "cudasim_launch_count");
    if (!BIG) CHECK_MSG(launch_count != NULL, "the stand-in has no cudasim_launch_count");
    int shapes[][3] = {{37, 24, 64}, {5, 16, 20}, {1, 8, 8}, {130, 64, 256}};
    for (int s = 0; s < 4; s++)
        for (int bf = 0; bf < 2; bf++) linear_gelu_case(bf, shapes[s][0], shapes[s][1], shapes[s][2]);
    if (BIG) linear_gelu_case(true, 2048, 768, 3072);
}

static void test_linear(void) {
    int shapes[][3] = {{7, 13, 5}, {64, 96, 200}, {33, 768, 50}, {1, 8, 3}, {130, 64, 300}, {130, 64, 2304}};
    for (int s = 0; s < (BIG ? 6 : 5); s++)
        for (int bf = 0; bf < 2; bf++) {
            linear_case(bf, shapes[s][0], shapes[s][1], shapes[s][2], true, bf, 0);
            linear_case(bf, shapes[s][0], shapes[s][1], shapes[s][2], false, false, 0);
        }
}

/* The bias epilogue's pointer alignment: the same shape with a 256-byte aligned bias, then
 * one 4 bytes (and 8 bytes) into its buffer. cuBLASLt's heuristic assumes the alignment of the
 * CUBLASLT_MATMUL_DESC_BIAS_POINTER set when it is asked; an algorithm chosen for one
 * alignment must not run with a less aligned bias (the stand-in's cublasLtMatmul refuses it,
 * where a GPU would fault or misread). */
static void test_linear_bias_alignment(void) {
    for (int bf = 0; bf < 2; bf++) {
        linear_case(bf, 9, 40, 24, true, false, 0);
        linear_case(bf, 9, 40, 24, true, false, 1);
        linear_case(bf, 9, 40, 24, true, false, 2);
        linear_case(bf, 9, 40, 24, true, false, 0);
    }
    kb_backend *G[] = {GPU32, GPU16};
    for (int i = 0; i < 2; i++) {
        CHECK_MSG(G[i]->status == 0, "bias alignment: status %d %s", G[i]->status, co_err_detail());
        kb_backend_clear_status(G[i]);
    }
}

/* ---------------------------------------------------------------- embeddings */

static void embed_case(int N, int C, int V, int P, bool wpe) {
    int32_t *tok = malloc(sizeof(int32_t) * N), *pos = malloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) {
        tok[n] = n % 3 == 0 ? 1 : gu_randint(V); /* a frequent id, as real text has */
        pos[n] = n % P;
    }
    float *wte = gu_rand((size_t)V * C, 1.0f), *wp = gu_rand((size_t)P * C, 1.0f), *dout = gu_rand((size_t)N * C, 1.0f);
    float *dwte = gu_rand((size_t)V * C, 0.1f), *dwpe = gu_rand((size_t)P * C, 0.1f);
    float *out = malloc(sizeof(float) * N * C);
    float *gte = gu_buf(GPU32, wte, (size_t)V * C), *gpe = gu_buf(GPU32, wp, (size_t)P * C);
    float *gdo = gu_buf(GPU32, dout, (size_t)N * C), *gdte = gu_buf(GPU32, dwte, (size_t)V * C);
    float *gdpe = gu_buf(GPU32, dwpe, (size_t)P * C), *gout = gu_buf(GPU32, NULL, (size_t)N * C);
    int32_t *gtok = gu_ibuf(GPU32, tok, N), *gpos = gu_ibuf(GPU32, pos, N);
    CPU32->ops->embed_forward(CPU32, out, tok, pos, wte, wpe ? wp : NULL, N, C);
    CPU32->ops->embed_backward(CPU32, dwte, wpe ? dwpe : NULL, dout, tok, pos, N, C, V);
    GPU32->ops->embed_forward(GPU32, gout, gtok, gpos, gte, wpe ? gpe : NULL, N, C);
    GPU32->ops->embed_backward(GPU32, gdte, wpe ? gdpe : NULL, gdo, gtok, gpos, N, C, V);
    float *h;
    h = gu_fetch(GPU32, gout, (size_t)N * C);
    GU_EQUAL("embed_forward", h, out, sizeof(float) * N * C);
    free(h);
    /* same order of additions as the CPU: bitwise equal */
    h = gu_fetch(GPU32, gdte, (size_t)V * C);
    GU_EQUAL("embed_backward dwte", h, dwte, sizeof(float) * V * C);
    free(h);
    if (wpe) {
        h = gu_fetch(GPU32, gdpe, (size_t)P * C);
        GU_EQUAL("embed_backward dwpe", h, dwpe, sizeof(float) * P * C);
        free(h);
    }
    float *gp[] = {gte, gpe, gdo, gdte, gdpe, gout, (float *)gtok, (float *)gpos};
    for (int i = 0; i < 8; i++) GPU32->ops->free(GPU32, gp[i]);
    free(tok), free(pos), free(wte), free(wp), free(dout), free(dwte), free(dwpe), free(out);
}

static void test_embed(void) {
    embed_case(37, 5, 11, 7, true);
    embed_case(1000, 96, 300, 128, true);
    if (BIG) embed_case(4096, 768, 50304, 1024, false);
    else embed_case(1000, 64, 50257, 1024, false);
    embed_case(3000, 33, 2000, 1500, true);
}

/* ---------------------------------------------------------------- norms */

static void norm_case(bool rms, int N, int C) {
    char label[96];
    snprintf(label, sizeof label, "%s N=%d C=%d", rms ? "rmsnorm" : "layernorm", N, C);
    float *in = gu_rand((size_t)N * C, 2.0f), *w = gu_rand(C, 1.0f), *b = gu_rand(C, 1.0f);
    for (int i = 0; i < N * C; i++) in[i] += 0.5f; /* a nonzero mean */
    float *dout = gu_rand((size_t)N * C, 1.0f), *din = gu_rand((size_t)N * C, 0.3f);
    float *dw = gu_rand(C, 0.1f), *db = gu_rand(C, 0.1f);
    float *out = malloc(sizeof(float) * N * C), *mean = malloc(sizeof(float) * N), *rstd = malloc(sizeof(float) * N);
    float *g_in = gu_buf(GPU32, in, (size_t)N * C), *g_w = gu_buf(GPU32, w, C), *g_b = gu_buf(GPU32, b, C);
    float *g_do = gu_buf(GPU32, dout, (size_t)N * C), *g_din = gu_buf(GPU32, din, (size_t)N * C);
    float *g_dw = gu_buf(GPU32, dw, C), *g_db = gu_buf(GPU32, db, C), *g_out = gu_buf(GPU32, NULL, (size_t)N * C);
    float *g_mean = gu_buf(GPU32, NULL, N), *g_rstd = gu_buf(GPU32, NULL, N);
    CPU32->ops->norm_forward(CPU32, rms, out, mean, rstd, in, w, b, N, C, 1e-5f);
    CPU32->ops->norm_backward(CPU32, rms, din, dw, db, dout, in, w, mean, rstd, N, C);
    GPU32->ops->norm_forward(GPU32, rms, g_out, g_mean, g_rstd, g_in, g_w, g_b, N, C, 1e-5f);
    GPU32->ops->norm_backward(GPU32, rms, g_din, g_dw, g_db, g_do, g_in, g_w, g_mean, g_rstd, N, C);
    float *h;
    char l2[128];
    snprintf(l2, sizeof l2, "%s out", label);
    h = gu_fetch(GPU32, g_out, (size_t)N * C);
    GU_CLOSE(l2, h, out, (size_t)N * C, 1e-5, 1e-4);
    free(h);
    snprintf(l2, sizeof l2, "%s rstd", label);
    h = gu_fetch(GPU32, g_rstd, N);
    GU_CLOSE(l2, h, rstd, N, 1e-6, 1e-5);
    free(h);
    snprintf(l2, sizeof l2, "%s din", label);
    h = gu_fetch(GPU32, g_din, (size_t)N * C);
    GU_CLOSE(l2, h, din, (size_t)N * C, 1e-5, 1e-4);
    free(h);
    snprintf(l2, sizeof l2, "%s dw", label);
    h = gu_fetch(GPU32, g_dw, C);
    GU_CLOSE(l2, h, dw, C, 1e-5 * N, 1e-4);
    free(h);
    if (!rms) {
        snprintf(l2, sizeof l2, "%s dbias", label);
        h = gu_fetch(GPU32, g_db, C);
        GU_CLOSE(l2, h, db, C, 1e-5 * N, 1e-4);
        free(h);
        snprintf(l2, sizeof l2, "%s mean", label);
        h = gu_fetch(GPU32, g_mean, N);
        GU_CLOSE(l2, h, mean, N, 1e-6, 1e-5);
        free(h);
    }
    float *gp[] = {g_in, g_w, g_b, g_do, g_din, g_dw, g_db, g_out, g_mean, g_rstd};
    for (int i = 0; i < 10; i++) GPU32->ops->free(GPU32, gp[i]);
    free(in), free(w), free(b), free(dout), free(din), free(dw), free(db), free(out), free(mean), free(rstd);
}

static void test_norm(void) {
    int shapes[][2] = {{37, 1}, {5, 7}, {300, 96}, {130, 768}, {3, 1000}, {2, 4099}, {1000, 768}};
    for (int s = 0; s < (BIG ? 7 : 6); s++) {
        norm_case(false, shapes[s][0], shapes[s][1]);
        norm_case(true, shapes[s][0], shapes[s][1]);
    }
}

/* ---------------------------------------------------------------- rope */

static void test_rope(void) {
    int cases[][4] = {{7, 2, 1, 4}, {300, 4, 2, 64}, {64, 3, 3, 6}};
    for (int k = 0; k < 3; k++) {
        int N = cases[k][0], nh = cases[k][1], nkv = cases[k][2], hd = cases[k][3];
        size_t n = (size_t)N * (nh + 2 * nkv) * hd;
        float *x = gu_rand(n, 1.0f);
        int32_t *pos = malloc(sizeof(int32_t) * N);
        for (int i = 0; i < N; i++) pos[i] = gu_randint(5000);
        float *gx = gu_buf(GPU32, x, n);
        int32_t *gpos = gu_ibuf(GPU32, pos, N);
        for (int inv = 0; inv < 2; inv++) {
            CPU32->ops->rope(CPU32, x, pos, N, nh, nkv, hd, 10000.0f, inv);
            GPU32->ops->rope(GPU32, gx, gpos, N, nh, nkv, hd, 10000.0f, inv);
            float *h = gu_fetch(GPU32, gx, n);
            GU_CLOSE(inv ? "rope inverse" : "rope", h, x, n, 1e-6, 1e-5);
            free(h);
        }
        GPU32->ops->free(GPU32, gx);
        GPU32->ops->free(GPU32, gpos);
        free(x), free(pos);
    }
}

/* ---------------------------------------------------------------- attention */

typedef struct attn_geo {
    int B, T, nh, nkv, hd;
    float p;
    bool seg;
} attn_geo;

/* tolerances of an attention case: out, lse, dqkv (absolute, relative) */
typedef struct attn_tol {
    double oa, orl, la, lr, da, dr;
} attn_tol;

/* G's attention forward and backward against the CPU's fp32 ones; with `repeat`, a second
 * run on G must give the same bits (the kernels have a fixed reduction order) */
static void attn_case_on(kb_backend *G, attn_geo g, attn_tol tol, bool repeat) {
    char label[160];
    snprintf(label, sizeof label, "attention%s B=%d T=%d nh=%d nkv=%d hd=%d p=%.2f seg=%d", G->opt.bf16 ? " bf16" : "",
             g.B, g.T, g.nh, g.nkv, g.hd, g.p, g.seg);
    int N = g.B * g.T, R = (g.nh + 2 * g.nkv) * g.hd, AH = g.nh * g.hd;
    size_t nq = (size_t)N * R, no = (size_t)N * AH, nl = (size_t)g.B * g.nh * g.T;
    float *qkv = gu_rand(nq, 1.5f), *dout = gu_rand(no, 1.0f);
    int32_t *seg = malloc(sizeof(int32_t) * N);
    for (int b = 0; b < g.B; b++) {
        int start = 0;
        for (int t = 0; t < g.T; t++) {
            if (t > 0 && gu_randint(9) == 0) start = t; /* documents of random lengths */
            seg[b * g.T + t] = start;
        }
    }
    float *out = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * nl), *dqkv = malloc(sizeof(float) * nq);
    uint64_t seed = 1234, off = 99;
    CPU32->ops->attention_forward(CPU32, out, lse, qkv, g.seg ? seg : NULL, g.B, g.T, g.nh, g.nkv, g.hd, g.p, seed, off);
    CPU32->ops->attention_backward(CPU32, dqkv, dout, qkv, out, lse, g.seg ? seg : NULL, g.B, g.T, g.nh, g.nkv, g.hd,
                                   g.p, seed, off);
    float *gq = gu_buf(G, qkv, nq), *gdo = gu_buf(G, dout, no), *go = gu_buf(G, NULL, no);
    float *gl = gu_buf(G, NULL, nl), *gdq = gu_buf(G, NULL, nq);
    int32_t *gseg = gu_ibuf(G, seg, N);
    float *first[3] = {NULL, NULL, NULL};
    for (int run = 0; run < (repeat ? 2 : 1); run++) {
        G->ops->attention_forward(G, go, gl, gq, g.seg ? gseg : NULL, g.B, g.T, g.nh, g.nkv, g.hd, g.p, seed, off);
        G->ops->attention_backward(G, gdq, gdo, gq, go, gl, g.seg ? gseg : NULL, g.B, g.T, g.nh, g.nkv, g.hd, g.p,
                                   seed, off);
        G->ops->sync(G);
        CHECK_MSG(G->status == 0, "%s: status %d %s", label, G->status, co_err_detail());
        kb_backend_clear_status(G);
        char l2[224];
        float *h[3] = {gu_fetch(G, go, no), gu_fetch(G, gl, nl), gu_fetch(G, gdq, nq)};
        if (run == 0) {
            snprintf(l2, sizeof l2, "%s out", label);
            GU_CLOSE(l2, h[0], out, no, tol.oa, tol.orl);
            snprintf(l2, sizeof l2, "%s lse", label);
            GU_CLOSE(l2, h[1], lse, nl, tol.la, tol.lr);
            snprintf(l2, sizeof l2, "%s dqkv", label);
            GU_CLOSE(l2, h[2], dqkv, nq, tol.da, tol.dr);
            for (int i = 0; i < 3; i++) first[i] = h[i];
        } else {
            snprintf(l2, sizeof l2, "%s: a second run, bitwise", label);
            size_t n3[3] = {no, nl, nq};
            for (int i = 0; i < 3; i++) {
                GU_EQUAL(l2, h[i], first[i], n3[i] * sizeof(float));
                free(h[i]);
            }
        }
    }
    for (int i = 0; i < 3; i++) free(first[i]);
    float *gp[] = {gq, gdo, go, gl, gdq, (float *)gseg};
    for (int i = 0; i < 6; i++) G->ops->free(G, gp[i]);
    free(qkv), free(dout), free(seg), free(out), free(lse), free(dqkv);
}

static const attn_tol ATT_FP32 = {1e-4, 1e-3, 1e-5, 1e-5, 2e-4, 2e-3};

static void attn_case(attn_geo g) { attn_case_on(GPU32, g, ATT_FP32, false); }

static void test_attention(void) {
    /* sequences 1, 31, 32, 33, 130, 1000 (the 32-row tiles), each register width E (hd 2..8,
     * ..16, ..32, ..64, ..128), grouped queries, masks on and off, dropout */
    attn_geo cases[] = {
        {2, 1, 2, 1, 8, 0.0f, false},    {1, 31, 2, 2, 4, 0.0f, false},   {1, 32, 2, 1, 16, 0.0f, false},
        {2, 33, 4, 2, 32, 0.0f, false},  {2, 33, 2, 2, 24, 0.0f, true},   {1, 130, 2, 1, 64, 0.0f, false},
        {1, 130, 4, 1, 8, 0.2f, true},   {1, 64, 2, 2, 128, 0.1f, false}, {1, 77, 1, 1, 96, 0.0f, true},
        {1, 1000, 1, 1, 4, 0.0f, false}, {1, 1000, 2, 1, 4, 0.0f, true},  {1, 5, 1, 1, 2, 0.5f, false},
    };
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attn_case(cases[i]);
    /* on a GPU, longer sequences and wider heads as well */
    attn_geo big[] = {
        {2, 77, 4, 2, 24, 0.3f, true},   {1, 257, 2, 2, 64, 0.2f, true},  {2, 100, 4, 4, 80, 0.0f, false},
        {3, 33, 6, 2, 16, 0.0f, true},   {1, 1000, 12, 4, 128, 0.1f, true}, {2, 1024, 12, 12, 64, 0.0f, false},
    };
    for (size_t i = 0; BIG && i < sizeof big / sizeof big[0]; i++) attn_case(big[i]);
}

/* the stand-in's count of WMMA products (cudasim_mma_count_get), or NULL on a GPU */
static unsigned long (*mma_count)(void);

/* bf16 mode with head dimension 64 or 128: the tensor-core kernels (cuda_flash.cu: bf16
 * tiles, fp32 accumulation) at sequences around their 16-row fragments and 32-row tiles,
 * grouped queries, document masks, dropout, against the CPU's fp32 attention. Tolerance:
 * q, k, v, dO and P (dS) are rounded to bf16 (relative 2^-9), so out within 2e-2 + 2e-2 |x|,
 * lse within 2e-2 + 1e-2 |x|, dqkv within 5e-2 + 5e-2 |x| (the inputs are up to 1.5, scores
 * up to ~4); a second run is bitwise the first. Other head dimensions take the fp32 kernels
 * in bf16 mode too (fp32 tolerance, and on the stand-in no tensor-core product). */
static void test_attention_tensor_cores(void) {
    const char *mod = getenv("COHORT_CUDA_MODULE");
    void *hm = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (hm) *(void **)&mma_count = dlsym(hm, "cudasim_mma_count_get");
    if (!BIG) CHECK_MSG(mma_count != NULL, "the stand-in has no cudasim_mma_count_get");
    const attn_tol bf = {2e-2, 2e-2, 2e-2, 1e-2, 5e-2, 5e-2};
    attn_geo cases[] = {
        {2, 1, 2, 1, 64, 0.0f, false},  {1, 15, 1, 1, 128, 0.0f, false}, {2, 16, 2, 2, 64, 0.0f, true},
        {1, 17, 2, 1, 128, 0.1f, true}, {1, 64, 2, 2, 64, 0.0f, false},  {1, 100, 1, 1, 128, 0.0f, true},
        {1, 129, 2, 1, 64, 0.2f, false}, {1, 129, 1, 1, 128, 0.0f, false},
    };
    unsigned long before = mma_count ? mma_count() : 0;
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) attn_case_on(GPU16, cases[i], bf, true);
    if (mma_count) CHECK_MSG(mma_count() > before, "bf16 attention at hd 64/128 ran no tensor-core product");
    attn_geo big[] = {{2, 1024, 12, 12, 64, 0.0f, false}, {1, 1000, 8, 2, 128, 0.1f, true}};
    for (size_t i = 0; BIG && i < sizeof big / sizeof big[0]; i++) attn_case_on(GPU16, big[i], bf, true);
    before = mma_count ? mma_count() : 0;
    attn_case_on(GPU16, (attn_geo){1, 33, 2, 1, 96, 0.0f, true}, ATT_FP32, false);
    if (mma_count) CHECK_MSG(mma_count() == before, "bf16 attention at hd 96 ran tensor-core products");
}

/* Block attention (context parallelism's ring, kernels/cuda/cuda_cp.cu): queries as the upper
 * half of each sequence of a packed qkv buffer (q_brows = 2 Tq) against keys and values of
 * another buffer, the mask none or causal (Tq == Tk: the whole sequences), document ids or
 * none; dq, dk, dv accumulate into nonzero buffers. */
static void block_case(int B, int Tq, int Tk, int nh, int nkv, int hd, bool causal, bool docs) {
    char label[160];
    snprintf(label, sizeof label, "block_attention B=%d Tq=%d Tk=%d nh=%d nkv=%d hd=%d causal=%d docs=%d", B, Tq, Tk,
             nh, nkv, hd, causal, docs);
    const int qbr = causal ? Tq : 2 * Tq, q0 = causal ? 0 : Tq;
    const size_t R = (size_t)(nh + 2 * nkv) * hd, kw = (size_t)2 * nkv * hd;
    const size_t nq = (size_t)B * qbr * R, nkv_ = (size_t)B * Tk * kw, no = (size_t)B * Tq * nh * hd;
    const size_t nl = (size_t)B * nh * Tq;
    float *qkv = gu_rand(nq, 1.5f), *kv = gu_rand(nkv_, 1.5f), *dout = gu_rand(no, 1.0f);
    float *dq0 = gu_rand(nq, 0.5f), *dkv0 = gu_rand(nkv_, 0.5f);
    int32_t *qd = malloc(sizeof(int32_t) * (size_t)B * qbr), *kd = malloc(sizeof(int32_t) * (size_t)B * Tk);
    for (int i = 0; i < B * qbr; i++) qd[i] = (i % qbr) / 5;
    for (int i = 0; i < B * Tk; i++) kd[i] = (i % Tk) / 7;
    float *out = malloc(sizeof(float) * no), *lse = malloc(sizeof(float) * nl);
    float *dq = malloc(sizeof(float) * nq), *dkv = malloc(sizeof(float) * nkv_);
    memcpy(dq, dq0, sizeof(float) * nq);
    memcpy(dkv, dkv0, sizeof(float) * nkv_);
    float *gq = gu_buf(GPU32, qkv, nq), *gkv = gu_buf(GPU32, kv, nkv_), *gdo = gu_buf(GPU32, dout, no);
    float *go = gu_buf(GPU32, NULL, no), *gl = gu_buf(GPU32, NULL, nl), *gdq = gu_buf(GPU32, dq0, nq);
    float *gdkv = gu_buf(GPU32, dkv0, nkv_);
    int32_t *gqd = gu_ibuf(GPU32, qd, B * qbr), *gkd = gu_ibuf(GPU32, kd, B * Tk);
    for (int dev = 0; dev < 2; dev++) {
        kb_backend *be = dev ? GPU32 : CPU32;
        const float *q = dev ? gq : qkv, *k = dev ? gkv : kv;
        kb_block_attn a = {.B = B, .Tq = Tq, .Tk = Tk, .nh = nh, .nkv = nkv, .hd = hd,
                           .mask = causal ? KB_BLOCK_MASK_CAUSAL : KB_BLOCK_MASK_NONE,
                           .q = q + (size_t)q0 * R, .k = k, .v = k + (size_t)nkv * hd, .q_stride = R, .k_stride = kw,
                           .v_stride = kw, .q_brows = qbr, .k_brows = Tk,
                           .qdoc = docs ? (dev ? gqd : qd) + q0 : NULL, .kdoc = docs ? (dev ? gkd : kd) : NULL};
        float *o = dev ? go : out, *l = dev ? gl : lse, *d_q = dev ? gdq : dq, *d_kv = dev ? gdkv : dkv;
        be->ops->block_attention_forward(be, &a, o, l);
        be->ops->block_attention_backward(be, &a, o, l, dev ? gdo : dout, d_q + (size_t)q0 * R, R, d_kv, kw,
                                          d_kv + (size_t)nkv * hd, kw);
    }
    GPU32->ops->sync(GPU32);
    CHECK_MSG(GPU32->status == 0, "%s: status %d %s", label, GPU32->status, co_err_detail());
    kb_backend_clear_status(GPU32);
    char l2[200];
    float *h;
    struct { const char *what; const float *g, *c; size_t n; double atol, rtol; } cmp[] = {
        {"out", go, out, no, 1e-4, 1e-3}, {"dq", gdq, dq, nq, 2e-4, 2e-3}, {"dkv", gdkv, dkv, nkv_, 2e-4, 2e-3}};
    for (int i = 0; i < 3; i++) {
        snprintf(l2, sizeof l2, "%s %s", label, cmp[i].what);
        h = gu_fetch(GPU32, cmp[i].g, cmp[i].n);
        GU_CLOSE(l2, h, cmp[i].c, cmp[i].n, cmp[i].atol, cmp[i].rtol);
        free(h);
    }
    /* lse: -inf where a row sees no key (documents), equal elsewhere */
    h = gu_fetch(GPU32, gl, nl);
    size_t bad = 0;
    for (size_t i = 0; i < nl; i++)
        bad += isinf(lse[i]) ? !(isinf(h[i]) && h[i] < 0) : !(fabsf(h[i] - lse[i]) <= 1e-5f + 1e-5f * fabsf(lse[i]));
    CHECK_MSG(bad == 0, "%s lse: %zu of %zu differ", label, bad, nl);
    free(h);
    float *gp[] = {gq, gkv, gdo, go, gl, gdq, gdkv, (float *)gqd, (float *)gkd};
    for (int i = 0; i < 9; i++) GPU32->ops->free(GPU32, gp[i]);
    free(qkv), free(kv), free(dout), free(dq0), free(dkv0), free(qd), free(kd), free(out), free(lse), free(dq), free(dkv);
}

static void test_block_attention(void) {
    block_case(2, 16, 16, 4, 2, 8, true, false);
    block_case(2, 16, 16, 4, 4, 8, true, true);
    block_case(1, 8, 16, 2, 1, 16, false, false);
    block_case(2, 8, 16, 4, 2, 8, false, true); /* rows whose documents no key shares: lse -inf */
    block_case(1, 33, 33, 2, 2, 128, true, false);
}

/* ---------------------------------------------------------------- activations, elementwise */

static void test_activations(void) {
    size_t n = 100001;
    float *x = gu_rand(n, 6.0f), *d = gu_rand(n, 1.0f), *y = gu_rand(n, 1.0f);
    n = 40001;
    float *gx = gu_buf(GPU32, x, n), *gd = gu_buf(GPU32, d, n), *gy = gu_buf(GPU32, y, n), *go = gu_buf(GPU32, NULL, n);
    float *o = malloc(sizeof(float) * n), *h;
    CPU32->ops->gelu_forward(CPU32, o, x, n);
    GPU32->ops->gelu_forward(GPU32, go, gx, n);
    h = gu_fetch(GPU32, go, n);
    GU_CLOSE("gelu_forward", h, o, n, 1e-6, 1e-5);
    free(h);
    CPU32->ops->gelu_backward(CPU32, o, d, x, n);
    GPU32->ops->gelu_backward(GPU32, go, gd, gx, n);
    h = gu_fetch(GPU32, go, n);
    GU_CLOSE("gelu_backward", h, o, n, 1e-6, 1e-5);
    free(h);
    int N = 133, F = 150; /* n >= N * 2F */
    CPU32->ops->swiglu_forward(CPU32, o, x, N, F);
    GPU32->ops->swiglu_forward(GPU32, go, gx, N, F);
    h = gu_fetch(GPU32, go, (size_t)N * F);
    GU_CLOSE("swiglu_forward", h, o, (size_t)N * F, 1e-6, 1e-5);
    free(h);
    CPU32->ops->swiglu_backward(CPU32, o, d, x, N, F);
    GPU32->ops->swiglu_backward(GPU32, go, gd, gx, N, F);
    h = gu_fetch(GPU32, go, (size_t)N * 2 * F);
    GU_CLOSE("swiglu_backward", h, o, (size_t)N * 2 * F, 1e-6, 1e-5);
    free(h);
    /* elementwise: same arithmetic, bitwise equal */
    CPU32->ops->add(CPU32, o, x, y, n);
    GPU32->ops->add(GPU32, go, gx, gy, n);
    h = gu_fetch(GPU32, go, n);
    GU_EQUAL("add", h, o, n * sizeof(float));
    free(h);
    CPU32->ops->scale(CPU32, o, 0.37f, n);
    GPU32->ops->scale(GPU32, go, 0.37f, n);
    h = gu_fetch(GPU32, go, n);
    GU_EQUAL("scale", h, o, n * sizeof(float));
    free(h);
    float ps[] = {0.0f, 0.1f, 0.5f};
    for (int k = 0; k < 3; k++) {
        CPU32->ops->dropout(CPU32, o, x, n, ps[k], 77, 1ull << 41);
        GPU32->ops->dropout(GPU32, go, gx, n, ps[k], 77, 1ull << 41);
        h = gu_fetch(GPU32, go, n);
        GU_EQUAL("dropout (identical masks)", h, o, n * sizeof(float));
        free(h);
    }
    GPU32->ops->free(GPU32, gx), GPU32->ops->free(GPU32, gd), GPU32->ops->free(GPU32, gy), GPU32->ops->free(GPU32, go);
    free(x), free(d), free(y), free(o);
}

/* ---------------------------------------------------------------- loss */

static void ce_case(int N, int Vp) {
    char label[96];
    snprintf(label, sizeof label, "cross_entropy N=%d Vp=%d", N, Vp);
    size_t n = (size_t)N * Vp;
    float *logits = gu_rand(n, 4.0f), *ds = malloc(sizeof(float) * N), *loss = malloc(sizeof(float) * N);
    int32_t *tg = malloc(sizeof(int32_t) * N);
    for (int i = 0; i < N; i++) {
        tg[i] = i % 7 == 5 ? -1 : gu_randint(Vp);
        ds[i] = i % 5 == 3 ? 0.0f : 0.5f + 0.5f * gu_uniform();
    }
    float *gl = gu_buf(GPU32, logits, n), *gds = gu_buf(GPU32, ds, N), *gloss = gu_buf(GPU32, NULL, N);
    int32_t *gtg = gu_ibuf(GPU32, tg, N);
    CPU32->ops->cross_entropy(CPU32, loss, logits, tg, ds, N, Vp);
    GPU32->ops->cross_entropy(GPU32, gloss, gl, gtg, gds, N, Vp);
    char l2[128];
    float *h;
    snprintf(l2, sizeof l2, "%s losses", label);
    h = gu_fetch(GPU32, gloss, N);
    GU_CLOSE(l2, h, loss, N, 1e-5, 1e-5);
    free(h);
    snprintf(l2, sizeof l2, "%s gradient", label);
    h = gu_fetch(GPU32, gl, n);
    GU_CLOSE(l2, h, logits, n, 1e-8, 1e-4);
    free(h);
    GPU32->ops->free(GPU32, gl), GPU32->ops->free(GPU32, gds), GPU32->ops->free(GPU32, gloss);
    GPU32->ops->free(GPU32, gtg);
    free(logits), free(ds), free(loss), free(tg);
}

static void test_cross_entropy(void) {
    ce_case(9, 1);
    ce_case(37, 100);
    ce_case(7, 50257);
    if (BIG) ce_case(64, 50304);
    ce_case(3, 2049);
}

/* ---------------------------------------------------------------- tensor parallelism */

/* bias_add: one addition per element, bitwise the CPU's. bias_grad: column sums of N rows
 * in another order than the CPU's: |gpu - cpu| <= 1e-6 N + 1e-6 + 1e-5 |cpu| (inputs in
 * [-1, 1): a sum's rounding error grows about as sqrt(N) eps |partial sums| ~ 3.5e-8 N,
 * so 1e-6 N is ~30 times that), and bitwise the same on a second run. */
static void bias_case(int N, int C) {
    char label[96];
    snprintf(label, sizeof label, "bias N=%d C=%d", N, C);
    float *out = gu_rand((size_t)N * C, 2.0f), *bias = gu_rand(C, 1.0f), *dout = gu_rand((size_t)N * C, 1.0f);
    float *db = gu_rand(C, 0.1f);
    float *g_out = gu_buf(GPU32, out, (size_t)N * C), *g_bias = gu_buf(GPU32, bias, C);
    float *g_dout = gu_buf(GPU32, dout, (size_t)N * C), *g_db = gu_buf(GPU32, db, C), *g_db2 = gu_buf(GPU32, db, C);
    CPU32->ops->bias_add(CPU32, out, bias, N, C);
    CPU32->ops->bias_grad(CPU32, db, dout, N, C);
    GPU32->ops->bias_add(GPU32, g_out, g_bias, N, C);
    GPU32->ops->bias_grad(GPU32, g_db, g_dout, N, C);
    GPU32->ops->bias_grad(GPU32, g_db2, g_dout, N, C);
    GPU32->ops->sync(GPU32);
    CHECK_MSG(GPU32->status == 0, "%s: status %d %s", label, GPU32->status, co_err_detail());
    char l2[128];
    float *h, *h2;
    snprintf(l2, sizeof l2, "%s: bias_add", label);
    h = gu_fetch(GPU32, g_out, (size_t)N * C);
    GU_EQUAL(l2, h, out, sizeof(float) * N * C);
    free(h);
    snprintf(l2, sizeof l2, "%s: bias_grad", label);
    h = gu_fetch(GPU32, g_db, C);
    GU_CLOSE(l2, h, db, C, 1e-6 * N + 1e-6, 1e-5);
    h2 = gu_fetch(GPU32, g_db2, C);
    snprintf(l2, sizeof l2, "%s: bias_grad repeated", label);
    GU_EQUAL(l2, h2, h, sizeof(float) * C);
    free(h), free(h2);
    float *gp[] = {g_out, g_bias, g_dout, g_db, g_db2};
    for (int i = 0; i < 5; i++) GPU32->ops->free(GPU32, gp[i]);
    free(out), free(bias), free(dout), free(db);
}

/* The vocabulary-parallel cross-entropy of tp shards of logits[N,Vt] (shard k: columns
 * [k V, (k+1) V), V = Vt/tp), each operation on the GPU against the CPU's on the same
 * inputs, the group's reductions done here:
 *   ce_max: the max is exact, bitwise the CPU's;
 *   ce_sums: sums of exponentials (the same cu_expf as cpu_expf, summed in another order)
 *     within 1e-7 + 2e-5 |cpu|; the target logit minus the max bitwise the CPU's;
 *   ce_grad (from the CPU's reduced sums): losses within 1e-6 + 1e-5 |cpu| (logf on the
 *     device may differ from glibc's in the last bit), gradients within 1e-8 + 1e-4 |cpu|;
 *   the GPU's whole pipeline (its own sums) against the CPU's unsharded cross_entropy
 *     within cross_entropy's tolerances above (losses 1e-5 + 1e-5 |cpu|, gradients
 *     1e-8 + 1e-4 |cpu|);
 *   ce_sums and ce_grad run twice: bitwise the same.
 * Targets: inside each shard, on shard boundaries, < 0, == Vt and > Vt; rows with dscale 0;
 * one row whose shards but the first lie 100 below its max (their exponentials are 0). */
static void ce_tp_case(int N, int Vt, int tp) {
    char label[96];
    snprintf(label, sizeof label, "vocabulary-parallel cross_entropy N=%d Vt=%d tp=%d", N, Vt, tp);
    const int V = Vt / tp;
    size_t nf = (size_t)N * Vt, ns = (size_t)N * V;
    float *full = gu_rand(nf, 4.0f), *ds = malloc(sizeof(float) * N);
    int32_t *tg = malloc(sizeof(int32_t) * N);
    for (int n = 0; n < N; n++) {
        int k = n % 9;
        tg[n] = k == 0   ? -1
                : k == 1 ? Vt
                : k == 2 ? Vt + 7
                : k == 3 ? (n / 9 % tp) * V /* the first column of a shard */
                : k == 4 ? Vt - 1
                         : gu_randint(Vt);
        ds[n] = n % 5 == 3 ? 0.0f : 0.5f + 0.5f * gu_uniform();
    }
    for (int j = V; j < Vt; j++) full[j] -= 100.0f; /* row 0: only shard 0 counts */
    float *shard = malloc(sizeof(float) * ns * tp), *cmx = malloc(sizeof(float) * N * tp);
    float *mx = malloc(sizeof(float) * N);
    float *csums = malloc(sizeof(float) * 2 * N * tp);
    float *cred = calloc(2 * (size_t)N, sizeof(float)), *gred = calloc(2 * (size_t)N, sizeof(float));
    float *closs = malloc(sizeof(float) * N), *full_loss = malloc(sizeof(float) * N);
    for (int k = 0; k < tp; k++)
        for (int n = 0; n < N; n++)
            memcpy(shard + ns * k + (size_t)n * V, full + (size_t)n * Vt + (size_t)k * V, sizeof(float) * V);
    /* three copies of the shards: ce_grad from the CPU's sums, again, from the GPU's sums */
    float *g_sh = gu_buf(GPU32, shard, ns * tp), *g_sh2 = gu_buf(GPU32, shard, ns * tp);
    float *g_sh3 = gu_buf(GPU32, shard, ns * tp);
    float *g_mx = gu_buf(GPU32, NULL, N), *g_sums = gu_buf(GPU32, NULL, 2 * (size_t)N);
    float *g_sums2 = gu_buf(GPU32, NULL, 2 * (size_t)N), *g_red = gu_buf(GPU32, NULL, 2 * (size_t)N);
    float *g_loss = gu_buf(GPU32, NULL, N), *g_loss2 = gu_buf(GPU32, NULL, N);
    float *g_ds = gu_buf(GPU32, ds, N);
    int32_t *g_tg = gu_ibuf(GPU32, tg, N);
    char l2[192];
    float *h, *h2;
    /* ce_max per shard, then the group's max */
    for (int k = 0; k < tp; k++) {
        CPU32->ops->ce_max(CPU32, cmx + (size_t)k * N, shard + ns * k, N, V);
        GPU32->ops->ce_max(GPU32, g_mx, g_sh + ns * k, N, V);
        h = gu_fetch(GPU32, g_mx, N);
        snprintf(l2, sizeof l2, "%s shard %d: ce_max", label, k);
        GU_EQUAL(l2, h, cmx + (size_t)k * N, sizeof(float) * N);
        free(h);
    }
    for (int n = 0; n < N; n++) {
        mx[n] = cmx[n];
        for (int k = 1; k < tp; k++) mx[n] = cmx[(size_t)k * N + n] > mx[n] ? cmx[(size_t)k * N + n] : mx[n];
    }
    GPU32->ops->copy(GPU32, g_mx, mx, sizeof(float) * N);
    /* ce_sums per shard from the group's max; the CPU's and the GPU's reductions */
    for (int k = 0; k < tp; k++) {
        float *cs = csums + (size_t)k * 2 * N, *gs;
        CPU32->ops->ce_sums(CPU32, cs, shard + ns * k, mx, tg, k * V, N, V);
        GPU32->ops->ce_sums(GPU32, g_sums, g_sh + ns * k, g_mx, g_tg, k * V, N, V);
        GPU32->ops->ce_sums(GPU32, g_sums2, g_sh + ns * k, g_mx, g_tg, k * V, N, V);
        gs = gu_fetch(GPU32, g_sums, 2 * (size_t)N);
        h2 = gu_fetch(GPU32, g_sums2, 2 * (size_t)N);
        snprintf(l2, sizeof l2, "%s shard %d: ce_sums (sums of exponentials)", label, k);
        GU_CLOSE(l2, gs, cs, N, 1e-7, 2e-5);
        snprintf(l2, sizeof l2, "%s shard %d: ce_sums (target logits)", label, k);
        GU_EQUAL(l2, gs + N, cs + N, sizeof(float) * N);
        snprintf(l2, sizeof l2, "%s shard %d: ce_sums repeated", label, k);
        GU_EQUAL(l2, h2, gs, sizeof(float) * 2 * N);
        for (int i = 0; i < 2 * N; i++) cred[i] += cs[i], gred[i] += gs[i];
        free(gs), free(h2);
    }
    /* ce_grad per shard: from the CPU's sums (the operation alone), and from the GPU's
     * own (the pipeline), against the CPU's unsharded cross_entropy */
    CPU32->ops->cross_entropy(CPU32, full_loss, full, tg, ds, N, Vt); /* full: now its gradient */
    for (int pass = 0; pass < 2; pass++) {
        GPU32->ops->copy(GPU32, g_red, pass == 0 ? cred : gred, sizeof(float) * 2 * N);
        for (int k = 0; k < tp; k++) {
            float *csh = shard + ns * k;
            float *gsh = (pass == 0 ? g_sh : g_sh3) + ns * k;
            if (pass == 0) {
                CPU32->ops->ce_grad(CPU32, closs, csh, mx, cred, tg, ds, k * V, Vt, N, V);
                GPU32->ops->ce_grad(GPU32, g_loss2, g_sh2 + ns * k, g_mx, g_red, g_tg, g_ds, k * V, Vt, N, V);
            }
            GPU32->ops->ce_grad(GPU32, g_loss, gsh, g_mx, g_red, g_tg, g_ds, k * V, Vt, N, V);
            const char *what = pass == 0 ? "ce_grad" : "pipeline vs unsharded cross_entropy";
            h = gu_fetch(GPU32, g_loss, N);
            snprintf(l2, sizeof l2, "%s shard %d: %s losses", label, k, what);
            GU_CLOSE(l2, h, pass == 0 ? closs : full_loss, N, pass == 0 ? 1e-6 : 1e-5, 1e-5);
            for (int n = 0; n < N; n++)
                if (tg[n] < 0 || tg[n] >= Vt)
                    CHECK_MSG(h[n] == 0.0f, "%s: row %d (target %d) has a loss", l2, n, tg[n]);
            free(h);
            h = gu_fetch(GPU32, gsh, ns);
            snprintf(l2, sizeof l2, "%s shard %d: %s gradient", label, k, what);
            if (pass == 0) {
                GU_CLOSE(l2, h, csh, ns, 1e-8, 1e-4);
            } else {
                float *want = malloc(sizeof(float) * ns);
                for (int n = 0; n < N; n++)
                    memcpy(want + (size_t)n * V, full + (size_t)n * Vt + (size_t)k * V, sizeof(float) * V);
                GU_CLOSE(l2, h, want, ns, 1e-8, 1e-4);
                free(want);
            }
            for (int n = 0; n < N; n++) {
                bool zero = true;
                for (int j = 0; j < V; j++) zero &= h[(size_t)n * V + j] == 0.0f;
                if (ds[n] == 0.0f) CHECK_MSG(zero, "%s: row %d has dscale 0 and a gradient", l2, n);
            }
            if (pass == 0) {
                h2 = gu_fetch(GPU32, g_sh2 + ns * k, ns);
                snprintf(l2, sizeof l2, "%s shard %d: ce_grad repeated", label, k);
                GU_EQUAL(l2, h2, h, sizeof(float) * ns);
                free(h2);
                float *l1 = gu_fetch(GPU32, g_loss, N), *lb = gu_fetch(GPU32, g_loss2, N);
                snprintf(l2, sizeof l2, "%s shard %d: ce_grad losses repeated", label, k);
                GU_EQUAL(l2, lb, l1, sizeof(float) * N);
                free(l1), free(lb);
            }
            free(h);
        }
    }
    GPU32->ops->sync(GPU32);
    CHECK_MSG(GPU32->status == 0, "%s: status %d %s", label, GPU32->status, co_err_detail());
    float *gp[] = {g_sh, g_sh2, g_sh3, g_mx, g_sums, g_sums2, g_red, g_loss, g_loss2, g_ds, (float *)g_tg};
    for (size_t i = 0; i < sizeof gp / sizeof gp[0]; i++) GPU32->ops->free(GPU32, gp[i]);
    free(full), free(ds), free(tg), free(shard), free(cmx), free(mx), free(csums), free(cred), free(gred);
    free(closs), free(full_loss);
}

static void test_tensor_parallel(void) {
    int bshapes[][2] = {{1, 1}, {7, 13}, {300, 96}, {130, 768}, {3, 4099}, {4099, 33}, {1000, 768}};
    for (int s = 0; s < (BIG ? 7 : 6); s++) bias_case(bshapes[s][0], bshapes[s][1]);
    /* V per shard: 1, 26, 250, 513 (one more than the block), 1024, 25152 (GPT-2's padded
     * vocabulary over 2) */
    int cshapes[][3] = {{9, 2, 2}, {37, 52, 2}, {37, 1000, 4}, {33, 1026, 2}, {17, 3072, 3}, {5, 50304, 2}, {64, 50304, 2}};
    for (int s = 0; s < (BIG ? 7 : 6); s++) ce_tp_case(cshapes[s][0], cshapes[s][1], cshapes[s][2]);
}

/* ---------------------------------------------------------------- optimizer */

static void test_optimizer(void) {
    size_t sizes[] = {1, 1000, 8192, 8193, 300001, 3000001};
    for (int k = 0; k < (BIG ? 6 : 5); k++) {
        size_t n = sizes[k];
        float *x = gu_rand(n, 3.0f);
        float *gx = gu_buf(GPU32, x, n);
        double c = CPU32->ops->sumsq(CPU32, x, n), g = GPU32->ops->sumsq(GPU32, gx, n);
        double g2 = GPU32->ops->sumsq(GPU32, gx, n);
        CHECK_MSG(fabs(c - g) <= 1e-12 * c, "sumsq n=%zu: gpu %.17g cpu %.17g", n, g, c);
        CHECK_MSG(memcmp(&g, &g2, sizeof g) == 0, "sumsq not repeatable");
        float *p = gu_rand(n, 1.0f), *gr = gu_rand(n, 1.0f), *m = gu_rand(n, 0.1f), *v = gu_rand(n, 0.01f);
        for (size_t i = 0; i < n; i++) v[i] = fabsf(v[i]);
        float *gp = gu_buf(GPU32, p, n), *gg = gu_buf(GPU32, gr, n), *gm = gu_buf(GPU32, m, n), *gv = gu_buf(GPU32, v, n);
        for (int t = 1; t <= 3; t++) {
            CPU32->ops->adamw(CPU32, p, gr, m, v, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
            GPU32->ops->adamw(GPU32, gp, gg, gm, gv, n, 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, t);
        }
        float *h;
        h = gu_fetch(GPU32, gp, n);
        GU_CLOSE("adamw p", h, p, n, 1e-7, 1e-6);
        free(h);
        h = gu_fetch(GPU32, gm, n);
        GU_CLOSE("adamw m", h, m, n, 1e-8, 1e-6);
        free(h);
        h = gu_fetch(GPU32, gv, n);
        GU_CLOSE("adamw v", h, v, n, 1e-10, 1e-6);
        free(h);
        float *gp2[] = {gx, gp, gg, gm, gv};
        for (int i = 0; i < 5; i++) GPU32->ops->free(GPU32, gp2[i]);
        free(x), free(p), free(gr), free(m), free(v);
    }
}

/* ---------------------------------------------------------------- checksum and norm runs */

/* the stand-in's count of host waits (cudasim_sync_count), or NULL on a GPU */
static unsigned long (*sync_count)(void);

static void find_sync_count(void) {
    const char *mod = getenv("COHORT_CUDA_MODULE");
    void *h = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (h) *(void **)&sync_count = dlsym(h, "cudasim_sync_count");
}

/* every XXH3 path: 4..16 bytes, 17..128, 129..240, the long path's partial and whole 1 KiB
 * blocks, several checksum blocks and a short last one; odd bit patterns too */
static void test_checksum(void) {
    static const size_t sizes[] = {1,  2,   3,   4,    5,     8,     16,    30,    32,    33,    59,
                                   60, 61,  64,  100,  255,   256,   257,   4000,  16383, 16384, 16385,
                                   40000, 49153};
    enum { NS = sizeof sizes / sizeof sizes[0] };
    const float *gx[NS];
    size_t n[NS];
    uint64_t seed[NS], want = 0;
    for (int k = 0; k < NS; k++) {
        float *x = gu_rand(sizes[k], 2.0f);
        if (sizes[k] > 8) x[3] = NAN, x[5] = -0.0f, x[7] = INFINITY, x[8] = 1e-42f;
        float *g = gu_buf(GPU32, x, sizes[k]);
        n[k] = sizes[k];
        seed[k] = k == 0 ? 0 : ((uint64_t)k << 40) + 12345u * (uint64_t)k;
        uint64_t c = kb_checksum_f32(x, n[k], seed[k]);
        uint64_t d = GPU32->ops->checksum_runs(GPU32, (const float *const *)&g, &n[k], &seed[k], 1);
        CHECK_MSG(d == c, "checksum n=%zu seed=%llu: gpu %016llx cpu %016llx", n[k], (unsigned long long)seed[k],
                  (unsigned long long)d, (unsigned long long)c);
        want ^= c;
        gx[k] = g;
        free(x);
    }
    unsigned long s0 = sync_count ? sync_count() : 0;
    uint64_t all = GPU32->ops->checksum_runs(GPU32, gx, n, seed, NS);
    CHECK_MSG(all == want, "checksum of %d runs: gpu %016llx cpu %016llx", NS, (unsigned long long)all,
              (unsigned long long)want);
    if (sync_count) CHECK_MSG(sync_count() - s0 == 1, "checksum_runs: %lu host waits", sync_count() - s0);
    CHECK_MSG(CPU32->ops->checksum_runs(CPU32, (const float *const *)gx, n, seed, 0) == 0, "no runs: 0");

    /* the gradient norm's runs: one wait, the bits of a host loop over sumsq */
    int end[2] = {NS / 2, NS};
    double out[2], loop[2] = {0, 0};
    for (int k = 0; k < NS; k++) loop[k >= NS / 2] += GPU32->ops->sumsq(GPU32, gx[k], n[k]);
    s0 = sync_count ? sync_count() : 0;
    GPU32->ops->sumsq_runs(GPU32, gx, n, end, 2, out);
    if (sync_count) CHECK_MSG(sync_count() - s0 == 1, "sumsq_runs: %lu host waits", sync_count() - s0);
    CHECK_MSG(memcmp(out, loop, sizeof out) == 0, "sumsq_runs %.17g %.17g, loop %.17g %.17g", out[0], out[1],
              loop[0], loop[1]);
    /* one group a run (the distributed optimizer's buckets: more than the 4 it once took) */
    int end1[NS];
    double out1[NS];
    for (int k = 0; k < NS; k++) end1[k] = k + 1;
    s0 = sync_count ? sync_count() : 0;
    GPU32->ops->sumsq_runs(GPU32, gx, n, end1, NS, out1);
    if (sync_count) CHECK_MSG(sync_count() - s0 == 1, "sumsq_runs, %d groups: %lu host waits", NS, sync_count() - s0);
    for (int k = 0; k < NS; k++) { /* (bitwise: some runs hold NaN patterns) */
        double one = GPU32->ops->sumsq(GPU32, gx[k], n[k]);
        CHECK_MSG(memcmp(&out1[k], &one, sizeof one) == 0, "sumsq_runs group %d of %d: %.17g, sumsq %.17g", k, NS,
                  out1[k], one);
    }
    CHECK_MSG(GPU32->status == 0, "sumsq_runs, %d groups: status %d", NS, GPU32->status);

    /* AdamW with the checksum of what it wrote: the p of the plain step, the digest of that p,
     * delivered at the sync (one wait for every tensor) */
    uint64_t sums[NS];
    float *p2[NS];
    for (int k = 0; k < NS; k++) {
        float *h = gu_fetch(GPU32, gx[k], n[k]);
        p2[k] = gu_buf(GPU32, h, n[k]);
        free(h);
    }
    float *gr = gu_buf(GPU32, NULL, 49153), *gm = gu_buf(GPU32, NULL, 49153), *gv = gu_buf(GPU32, NULL, 49153);
    float *gr2 = gu_buf(GPU32, NULL, 49153), *gm2 = gu_buf(GPU32, NULL, 49153), *gv2 = gu_buf(GPU32, NULL, 49153);
    float *hr = gu_rand(49153, 1.0f);
    GPU32->ops->copy(GPU32, gr, hr, 49153 * sizeof(float));
    GPU32->ops->copy(GPU32, gr2, hr, 49153 * sizeof(float));
    free(hr);
    GPU32->ops->sync(GPU32);
    s0 = sync_count ? sync_count() : 0;
    for (int k = 0; k < NS; k++) {
        sums[k] = 0x5a5a;
        GPU32->ops->adamw_checksum(GPU32, (float *)gx[k], gr, gm, gv, n[k], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 2,
                                   seed[k], &sums[k]);
    }
    GPU32->ops->sync(GPU32);
    if (sync_count) CHECK_MSG(sync_count() - s0 == 1, "adamw_checksum: %lu host waits", sync_count() - s0);
    for (int k = 0; k < NS; k++) {
        GPU32->ops->adamw(GPU32, p2[k], gr2, gm2, gv2, n[k], 1e-3f, 0.9f, 0.95f, 1e-8f, 0.1f, 0.7f, 2);
        float *a = gu_fetch(GPU32, gx[k], n[k]), *b = gu_fetch(GPU32, p2[k], n[k]);
        CHECK_MSG(memcmp(a, b, n[k] * sizeof(float)) == 0, "adamw_checksum n=%zu: p differs from adamw's", n[k]);
        uint64_t c = kb_checksum_f32(a, n[k], seed[k]);
        CHECK_MSG(sums[k] == c, "adamw_checksum n=%zu: gpu %016llx cpu %016llx", n[k], (unsigned long long)sums[k],
                  (unsigned long long)c);
        free(a), free(b);
        GPU32->ops->free(GPU32, (float *)gx[k]);
        GPU32->ops->free(GPU32, p2[k]);
    }
    float *bufs[] = {gr, gm, gv, gr2, gm2, gv2};
    for (int i = 0; i < 6; i++) GPU32->ops->free(GPU32, bufs[i]);
}

/* ---------------------------------------------------------------- grouped products */

/* uneven groups, empty ones, off[0] > 0; against the CPU backend's grouped products */
static void grouped_case(int n, const int *rows, int pre, int IC, int OC) {
    char label[96];
    snprintf(label, sizeof label, "grouped n=%d IC=%d OC=%d", n, IC, OC);
    int32_t off[9];
    off[0] = pre;
    for (int j = 0; j < n; j++) off[j + 1] = off[j] + rows[j];
    int R = off[n] + 3;
    float *in = gu_rand((size_t)R * IC, 1.0f), *W = gu_rand((size_t)n * OC * IC, 0.5f), *dout = gu_rand((size_t)R * OC, 1.0f);
    float *out = gu_rand((size_t)R * OC, 1.0f), *din = gu_rand((size_t)R * IC, 1.0f), *dW = gu_rand((size_t)n * OC * IC, 0.1f);
    float *gin = gu_buf(GPU32, in, (size_t)R * IC), *gW = gu_buf(GPU32, W, (size_t)n * OC * IC);
    float *gdo = gu_buf(GPU32, dout, (size_t)R * OC), *gout = gu_buf(GPU32, out, (size_t)R * OC);
    float *gdin = gu_buf(GPU32, din, (size_t)R * IC), *gdW = gu_buf(GPU32, dW, (size_t)n * OC * IC);
    CPU32->ops->grouped_linear_forward(CPU32, out, in, W, off, n, IC, OC);
    CPU32->ops->grouped_linear_backward(CPU32, din, dW, dout, in, W, off, n, IC, OC);
    GPU32->ops->grouped_linear_forward(GPU32, gout, gin, gW, off, n, IC, OC);
    GPU32->ops->grouped_linear_backward(GPU32, gdin, gdW, gdo, gin, gW, off, n, IC, OC);
    GPU32->ops->sync(GPU32);
    CHECK_MSG(GPU32->status == 0, "%s: status %d %s", label, GPU32->status, co_err_detail());
    char l2[128];
    float *h;
    snprintf(l2, sizeof l2, "%s out", label);
    h = gu_fetch(GPU32, gout, (size_t)R * OC);
    GU_CLOSE(l2, h, out, (size_t)R * OC, 1e-4 * IC / 16 + 1e-4, 1e-4);
    free(h);
    snprintf(l2, sizeof l2, "%s din", label);
    h = gu_fetch(GPU32, gdin, (size_t)R * IC);
    GU_CLOSE(l2, h, din, (size_t)R * IC, 1e-4 * OC / 16 + 1e-4, 1e-4);
    free(h);
    snprintf(l2, sizeof l2, "%s dW", label);
    h = gu_fetch(GPU32, gdW, (size_t)n * OC * IC);
    GU_CLOSE(l2, h, dW, (size_t)n * OC * IC, 1e-4 * R / 16 + 1e-4, 1e-4);
    free(h);
    float *gp[] = {gin, gW, gdo, gout, gdin, gdW};
    for (int i = 0; i < 6; i++) GPU32->ops->free(GPU32, gp[i]);
    free(in), free(W), free(dout), free(out), free(din), free(dW);
}

static void test_grouped(void) {
    int r1[] = {5, 0, 17, 1}, r2[] = {0, 0, 40}, r3[] = {33, 31, 0, 2, 9, 0, 1, 64};
    grouped_case(4, r1, 3, 24, 40);
    grouped_case(3, r2, 0, 7, 5);
    grouped_case(8, r3, 1, 33, 16);
}


/* ---------------------------------------------------------------- MoE permutations */

/* A backend copy of n bytes of host data */
static void *mp_dev(kb_backend *G, const void *host, size_t n) {
    void *p = G->ops->alloc(G, n ? n : 1);
    if (n) G->ops->copy(G, p, host, n);
    return p;
}

/* gather_rows (with and without an index, from fp32 and bf16), combine_rows (weighted and
 * not, overwriting and accumulating, tokens with no rows) and combine_backward at N tokens
 * of M rows of C columns (M, N, C crossing the kernels' 256- and 128-thread blocks): bitwise
 * the CPU backend's, and a second GPU run bitwise the first. */
static void perm_case(int N, int M, int C) {
    char label[96];
    snprintf(label, sizeof label, "moe permutations N=%d M=%d C=%d", N, M, C);
    size_t NC = (size_t)N * C, MC = (size_t)M * C;
    int32_t *idx = malloc(sizeof(int32_t) * (M ? M : 1)), *off = malloc(sizeof(int32_t) * (N + 1));
    int32_t *row = malloc(sizeof(int32_t) * (M ? M : 1));
    for (int r = 0; r < M; r++) idx[r] = gu_randint(N);
    /* each token's rows: the rows r with idx[r] == n, ascending (as the MoE layer's tables);
     * token 0 none when N > 1 */
    off[0] = 0;
    for (int n = 0, k = 0; n < N; n++) {
        for (int r = 0; r < M; r++)
            if (idx[r] == n && !(n == 0 && N > 1)) row[k++] = r;
        off[n + 1] = k;
    }
    int K = off[N];
    float *x = gu_rand(NC, 1.0f), *src = gu_rand(MC, 1.0f), *w = gu_rand(M, 1.0f), *dy = gu_rand(NC, 1.0f);
    uint16_t *x16 = malloc(2 * (NC ? NC : 1));
    for (size_t i = 0; i < NC; i++) x16[i] = (uint16_t)(gu_randint(65536) & 0xff7f); /* (no NaN) */
    float *yc = gu_rand(NC, 1.0f);
    /* CPU */
    float *c_g = malloc(sizeof(float) * (MC ? MC : 1)), *c_gi = malloc(sizeof(float) * (NC ? NC : 1));
    float *c_g16 = malloc(sizeof(float) * (MC ? MC : 1)), *c_y = malloc(sizeof(float) * (NC ? NC : 1));
    float *c_ya = malloc(sizeof(float) * (NC ? NC : 1)), *c_do = malloc(sizeof(float) * (MC ? MC : 1));
    double *c_dw = malloc(sizeof(double) * (M ? M : 1));
    memcpy(c_ya, yc, sizeof(float) * NC);
    const kb_ops *co = CPU32->ops;
    co->gather_rows(CPU32, c_g, x, idx, M, C);
    co->gather_rows(CPU32, c_gi, x, NULL, N, C);
    co->gather_rows_bf16(CPU32, c_g16, x16, idx, M, C);
    co->combine_rows(CPU32, c_y, src, off, row, w, N, C, false);
    co->combine_rows(CPU32, c_ya, src, off, row, NULL, N, C, true);
    co->combine_backward(CPU32, c_do, c_dw, dy, src, idx, w, M, C);
    for (int rep = 0; rep < 2; rep++) {
        kb_backend *G = rep ? GPU16 : GPU32; /* (the mode does not matter to these) */
        const kb_ops *o = G->ops;
        int32_t *gidx = mp_dev(G, idx, sizeof(int32_t) * M), *goff = mp_dev(G, off, sizeof(int32_t) * (N + 1));
        int32_t *grow = mp_dev(G, row, sizeof(int32_t) * K);
        float *gx = gu_buf(G, x, NC), *gsrc = gu_buf(G, src, MC), *gw = gu_buf(G, w, M), *gdy = gu_buf(G, dy, NC);
        uint16_t *gx16 = mp_dev(G, x16, 2 * NC);
        float *g_g = gu_buf(G, NULL, MC), *g_gi = gu_buf(G, NULL, NC), *g_g16 = gu_buf(G, NULL, MC);
        float *g_y = gu_buf(G, yc, NC), *g_ya = gu_buf(G, yc, NC), *g_do = gu_buf(G, NULL, MC);
        double *g_dw = G->ops->alloc(G, sizeof(double) * (M ? M : 1));
        o->gather_rows(G, g_g, gx, gidx, M, C);
        o->gather_rows(G, g_gi, gx, NULL, N, C);
        o->gather_rows_bf16(G, g_g16, gx16, gidx, M, C);
        o->combine_rows(G, g_y, gsrc, goff, grow, gw, N, C, false);
        o->combine_rows(G, g_ya, gsrc, goff, grow, NULL, N, C, true);
        o->combine_backward(G, g_do, g_dw, gdy, gsrc, gidx, gw, M, C);
        o->sync(G);
        CHECK_MSG(G->status == 0, "%s: status %d %s", label, G->status, co_err_detail());
        struct {
            const char *what;
            const void *g, *c;
            size_t bytes;
        } cmp[] = {{"gather_rows", g_g, c_g, 4 * MC},          {"gather_rows (no index)", g_gi, c_gi, 4 * NC},
                   {"gather_rows_bf16", g_g16, c_g16, 4 * MC}, {"combine_rows", g_y, c_y, 4 * NC},
                   {"combine_rows (acc)", g_ya, c_ya, 4 * NC}, {"combine_backward dout", g_do, c_do, 4 * MC},
                   {"combine_backward dw", g_dw, c_dw, 8 * (size_t)M}};
        for (size_t i = 0; i < sizeof cmp / sizeof cmp[0]; i++) {
            void *h = malloc(cmp[i].bytes ? cmp[i].bytes : 1);
            o->copy(G, h, cmp[i].g, cmp[i].bytes);
            CHECK_MSG(memcmp(h, cmp[i].c, cmp[i].bytes) == 0, "%s: %s (%s) is not bitwise the CPU's", label,
                      cmp[i].what, rep ? "bf16 backend" : "fp32 backend");
            free(h);
        }
        void *gp[] = {gidx, goff, grow, gx, gsrc, gw, gdy, gx16, g_g, g_gi, g_g16, g_y, g_ya, g_do, g_dw};
        for (size_t i = 0; i < sizeof gp / sizeof gp[0]; i++) o->free(G, gp[i]);
    }
    /* the bf16 widening is exact */
    for (int r = 0; r < M; r++) {
        uint32_t u;
        memcpy(&u, &c_g16[(size_t)r * C], 4);
        CHECK_MSG(C == 0 || u == (uint32_t)x16[(size_t)idx[r] * C] << 16, "%s: gather_rows_bf16 row %d", label, r);
    }
    free(idx), free(off), free(row), free(x), free(src), free(w), free(dy), free(x16), free(yc);
    free(c_g), free(c_gi), free(c_g16), free(c_y), free(c_ya), free(c_do), free(c_dw);
}

static void test_moe_permutations(void) {
    perm_case(1, 1, 1);
    perm_case(7, 0, 33);
    perm_case(37, 80, 33);     /* M*C = 2640: past ten 256-thread blocks */
    perm_case(129, 300, 257);  /* M > 256 rows (combine_backward's 128-thread blocks), C > 256 */
    if (BIG) perm_case(4096, 8192, 768);
}

/* ---------------------------------------------------------------- the table */

/* ---------------------------------------------------------------- bf16 activations */

static float *widen16(const uint16_t *x, size_t n) {
    float *f = malloc(sizeof(float) * (n ? n : 1));
    for (size_t i = 0; i < n; i++) {
        uint32_t u = (uint32_t)x[i] << 16;
        memcpy(&f[i], &u, 4);
    }
    return f;
}
static uint16_t *fetch16(kb_backend *G, const void *p, size_t n) {
    uint16_t *h = malloc(2 * (n ? n : 1));
    G->ops->copy(G, h, p, 2 * n);
    return h;
}
/* the bf16 bits the fp32 buffer p holds, rounded as the products round (to_bf16) */
static uint16_t *round16(kb_backend *G, const float *p, size_t n) {
    uint16_t *g = G->ops->alloc(G, 2 * (n ? n : 1));
    G->ops->to_bf16(G, g, p, n);
    uint16_t *h = fetch16(G, g, n);
    G->ops->free(G, g);
    return h;
}

/* swiglu_forward_bf16: its bf16 output is the fp32 swiglu_forward's output rounded once,
 * bitwise, at shapes crossing the blocks (the SwiGLU layers' output under bf16 activations) */
static void test_swiglu16(void) {
    kb_backend *G = GPU16;
    static const int shapes[][2] = {{1, 1}, {133, 150}, {64, 1024}, {7, 4097}};
    for (size_t k = 0; k < sizeof shapes / sizeof shapes[0]; k++) {
        int N = shapes[k][0], F = shapes[k][1];
        size_t NF = (size_t)N * F;
        float *x = gu_rand(2 * NF, 6.0f), *gx = gu_buf(G, x, 2 * NF), *o32 = gu_buf(G, NULL, NF);
        uint16_t *o16 = G->ops->alloc(G, 2 * NF);
        G->ops->swiglu_forward(G, o32, gx, N, F);
        G->ops->swiglu_forward_bf16(G, o16, gx, N, F);
        uint16_t *h = fetch16(G, o16, NF), *r = round16(G, o32, NF);
        char label[80];
        snprintf(label, sizeof label, "swiglu_forward_bf16 N=%d F=%d", N, F);
        GU_EQUAL(label, h, r, 2 * NF);
        CHECK_MSG(G->status == 0, "%s: status %d", label, G->status);
        free(h), free(r), free(x);
        G->ops->free(G, gx), G->ops->free(G, o32), G->ops->free(G, o16);
    }
}

/* A layer's bf16-activation entries (backend.h *_bf16) at shapes crossing the tiles, each
 * against its fp32-activation form on the same backend: the bf16 output must be the fp32
 * output rounded once (bitwise), a product of a bf16 activation bitwise the product of its
 * fp32 form (which rounds the same values per call), the attention backward from a bf16
 * output bitwise the fp32 backward given those values widened; and against the CPU (fp32
 * kernels, rounded the same way) within the fp32 tolerances of the entries above. */
static void act16_case(int N, int C, int F, attn_geo g) {
    kb_backend *G = GPU16, *Cb = CPU16;
    char label[160];
    snprintf(label, sizeof label, "bf16 activations N=%d C=%d F=%d attention B=%d T=%d nh=%d nkv=%d hd=%d", N, C, F,
             g.B, g.T, g.nh, g.nkv, g.hd);
    size_t NC = (size_t)N * C, NF = (size_t)N * F;
    float *x = gu_rand(NC, 2.0f), *w = gu_rand(C, 1.0f), *b = gu_rand(C, 1.0f), *W1 = gu_rand((size_t)F * C, 0.5f);
    float *b1 = gu_rand(F, 1.0f), *W2 = gu_rand((size_t)C * F, 0.5f), *dy = gu_rand(NC, 1.0f);
    float *gx = gu_buf(G, x, NC), *gw = gu_buf(G, w, C), *gb = gu_buf(G, b, C), *gW1 = gu_buf(G, W1, (size_t)F * C);
    float *gb1 = gu_buf(G, b1, F), *gW2 = gu_buf(G, W2, (size_t)C * F), *gdy = gu_buf(G, dy, NC);
    float *ln32 = gu_buf(G, NULL, NC), *mean = gu_buf(G, NULL, N), *rstd = gu_buf(G, NULL, N);
    float *mean16 = gu_buf(G, NULL, N), *rstd16 = gu_buf(G, NULL, N);
    uint16_t *ln16 = G->ops->alloc(G, 2 * NC), *act16 = G->ops->alloc(G, 2 * NF);
    float *pre32 = gu_buf(G, NULL, NF), *act32 = gu_buf(G, NULL, NF), *pre16 = gu_buf(G, NULL, NF);
    float *y32 = gu_buf(G, NULL, NC), *y16 = gu_buf(G, NULL, NC);
    /* per path: din [N,F], dW2 [C,F], db2 [C] */
    float *dinA = gu_buf(G, NULL, NF), *dinB = gu_buf(G, NULL, NF);
    float *dWA = gu_buf(G, NULL, (size_t)C * F), *dWB = gu_buf(G, NULL, (size_t)C * F);
    float *dbA = gu_buf(G, NULL, C), *dbB = gu_buf(G, NULL, C);
    const kb_ops *o = G->ops;
    o->norm_forward(G, false, ln32, mean, rstd, gx, gw, gb, N, C, 1e-5f);
    o->norm_forward_bf16(G, false, ln16, mean16, rstd16, gx, gw, gb, N, C, 1e-5f);
    o->linear_gelu_forward(G, act32, pre32, ln32, gW1, NULL, gb1, N, C, F);
    /* F a multiple of 8: one cuBLASLt product writes the bf16 GELU output (no kernel on the
     * stand-in, with the weights' bf16 copy given); otherwise the product and a GELU kernel */
    uint16_t *gW1_16 = o->alloc(G, 2 * (size_t)F * C);
    o->to_bf16(G, gW1_16, gW1, (size_t)F * C);
    o->sync(G);
    unsigned long l0 = launch_count ? launch_count() : 0;
    o->linear_gelu_forward_bf16(G, act16, pre16, ln16, gW1, gW1_16, gb1, N, C, F);
    o->sync(G);
    unsigned long l1 = launch_count ? launch_count() : 0;
    if (launch_count)
        CHECK_MSG(F % 8 == 0 ? l1 == l0 : l1 > l0, "%s: the bf16 GELU product launched %lu kernels", label, l1 - l0);
    o->free(G, gW1_16);
    /* fc2 from the bf16 GELU output, and (the fp32-activation path) from its values widened */
    uint16_t *a16h = fetch16(G, act16, NF);
    float *a16w = widen16(a16h, NF), *actw = gu_buf(G, a16w, NF);
    free(a16h), free(a16w);
    o->linear_forward(G, y32, actw, gW2, NULL, b, N, F, C);
    o->linear_forward_bf16(G, y16, act16, gW2, NULL, b, N, F, C);
    o->linear_backward(G, dinA, dWA, dbA, gdy, actw, gW2, NULL, N, F, C);
    o->linear_backward_bf16(G, dinB, dWB, dbB, gdy, act16, gW2, NULL, N, F, C);
    o->sync(G);
    CHECK_MSG(G->status == 0, "%s: status %d %s", label, G->status, co_err_detail());
    kb_backend_clear_status(G);
    char l2[240];
    uint16_t *h16 = fetch16(G, ln16, NC), *r16 = round16(G, ln32, NC);
    snprintf(l2, sizeof l2, "%s: the norm's bf16 output is its fp32 output rounded", label);
    GU_EQUAL(l2, h16, r16, 2 * NC);
    float *cln = malloc(sizeof(float) * NC), *cm = malloc(sizeof(float) * N), *cr = malloc(sizeof(float) * N);
    Cb->ops->norm_forward(Cb, false, cln, cm, cr, x, w, b, N, C, 1e-5f);
    float *wide = widen16(h16, NC);
    snprintf(l2, sizeof l2, "%s: the norm's bf16 output against the CPU's", label);
    GU_CLOSE(l2, wide, cln, NC, 1e-5, 1.0 / 256); /* one bf16 rounding */
    float *hm = gu_fetch(G, mean16, N), *hm2 = gu_fetch(G, mean, N), *hr = gu_fetch(G, rstd16, N), *hr2 = gu_fetch(G, rstd, N);
    snprintf(l2, sizeof l2, "%s: the norm's statistics stay fp32", label);
    GU_EQUAL(l2, hm, hm2, sizeof(float) * N);
    GU_EQUAL(l2, hr, hr2, sizeof(float) * N);
    free(h16), free(r16), free(wide), free(cln), free(cm), free(cr), free(hm), free(hm2), free(hr), free(hr2);
    /* the GELU product with a bf16 output is another cuBLASLt algorithm than the fp32 one, on a
     * GPU free to sum in another order: bitwise on the stand-in (computed in double either way),
     * within fp32 rounding (pre) and one bf16 rounding (the output) on a GPU */
    h16 = fetch16(G, act16, NF), r16 = round16(G, act32, NF);
    snprintf(l2, sizeof l2, "%s: the GELU product's bf16 output is its fp32 output rounded", label);
    if (!BIG) {
        GU_EQUAL(l2, h16, r16, 2 * NF);
    } else {
        float *wa = widen16(h16, NF), *wb = widen16(r16, NF);
        GU_CLOSE(l2, wa, wb, NF, 1e-4, 1.0 / 128);
        free(wa), free(wb);
        float *pa = gu_fetch(G, pre32, NF), *pb = gu_fetch(G, pre16, NF);
        snprintf(l2, sizeof l2, "%s: the GELU product's pre-activation", label);
        GU_CLOSE(l2, pb, pa, NF, 1e-4 * C / 16 + 1e-5, 1e-4);
        free(pa), free(pb);
    }
    free(h16), free(r16);
    struct { const char *what; float *a, *b; size_t n; } same[] = {
        {"fc2 output", y32, y16, NC}, {"fc2 din", dinA, dinB, NF}, {"fc2 dW", dWA, dWB, (size_t)C * F},
        {"fc2 dbias", dbA, dbB, C}, {"pre-activation", pre32, pre16, NF}};
    /* (the fc2 entries read the same bf16 values through the same algorithm: bitwise on a GPU too) */
    for (size_t i = 0; i < sizeof same / sizeof same[0] - (BIG ? 1 : 0); i++) {
        float *ha = gu_fetch(G, same[i].a, same[i].n), *hb = gu_fetch(G, same[i].b, same[i].n);
        snprintf(l2, sizeof l2, "%s: %s bitwise the fp32-activation path's", label, same[i].what);
        GU_EQUAL(l2, hb, ha, sizeof(float) * same[i].n);
        free(ha), free(hb);
    }
    float *gp[] = {actw, gx, gw, gb, gW1, gb1, gW2, gdy, ln32, mean, rstd, mean16, rstd16, pre32, act32, pre16, y32, y16,
                   dinA, dinB, dWA, dWB, dbA, dbB};
    for (size_t i = 0; i < sizeof gp / sizeof gp[0]; i++) o->free(G, gp[i]);
    o->free(G, ln16), o->free(G, act16);
    free(x), free(w), free(b), free(W1), free(b1), free(W2), free(dy);

    /* attention: out in bf16; the backward reads it */
    int NT = g.B * g.T, R = (g.nh + 2 * g.nkv) * g.hd, AH = g.nh * g.hd;
    size_t nq = (size_t)NT * R, no = (size_t)NT * AH, nl = (size_t)g.B * g.nh * g.T;
    float *qkv = gu_rand(nq, 1.5f), *dout = gu_rand(no, 1.0f);
    float *gq = gu_buf(G, qkv, nq), *gdo = gu_buf(G, dout, no), *go32 = gu_buf(G, NULL, no);
    float *gl32 = gu_buf(G, NULL, nl), *gl16 = gu_buf(G, NULL, nl), *gdqA = gu_buf(G, NULL, nq);
    float *gdqB = gu_buf(G, NULL, nq), *gow = gu_buf(G, NULL, no);
    uint16_t *go16 = o->alloc(G, 2 * no);
    o->attention_forward(G, go32, gl32, gq, NULL, g.B, g.T, g.nh, g.nkv, g.hd, g.p, 7, 3);
    o->attention_forward_bf16(G, go16, gl16, gq, NULL, g.B, g.T, g.nh, g.nkv, g.hd, g.p, 7, 3);
    o->sync(G);
    h16 = fetch16(G, go16, no);
    wide = widen16(h16, no);
    o->copy(G, gow, wide, sizeof(float) * no);
    o->attention_backward(G, gdqA, gdo, gq, gow, gl16, NULL, g.B, g.T, g.nh, g.nkv, g.hd, g.p, 7, 3);
    o->attention_backward_bf16(G, gdqB, gdo, gq, go16, gl16, NULL, g.B, g.T, g.nh, g.nkv, g.hd, g.p, 7, 3);
    o->sync(G);
    CHECK_MSG(G->status == 0, "%s: attention status %d %s", label, G->status, co_err_detail());
    kb_backend_clear_status(G);
    r16 = round16(G, go32, no);
    snprintf(l2, sizeof l2, "%s: attention's bf16 output is its fp32 output rounded", label);
    GU_EQUAL(l2, h16, r16, 2 * no);
    float *la = gu_fetch(G, gl32, nl), *lb = gu_fetch(G, gl16, nl);
    snprintf(l2, sizeof l2, "%s: attention's lse the same", label);
    GU_EQUAL(l2, lb, la, sizeof(float) * nl);
    float *da = gu_fetch(G, gdqA, nq), *db = gu_fetch(G, gdqB, nq);
    snprintf(l2, sizeof l2, "%s: attention's backward from the bf16 output", label);
    GU_EQUAL(l2, db, da, sizeof(float) * nq);
    /* and the CPU's fp32 backward given the same (widened) output */
    float *cdq = malloc(sizeof(float) * nq);
    CPU32->ops->attention_backward(CPU32, cdq, dout, qkv, wide, la, NULL, g.B, g.T, g.nh, g.nkv, g.hd, g.p, 7, 3);
    snprintf(l2, sizeof l2, "%s: attention's backward against the CPU's", label);
    GU_CLOSE(l2, db, cdq, nq, 5e-2, 5e-2); /* the tensor-core backward's bounds (docs/gpu.md) */
    free(h16), free(r16), free(wide), free(la), free(lb), free(da), free(db), free(cdq);
    float *ga[] = {gq, gdo, go32, gl32, gl16, gdqA, gdqB, gow};
    for (size_t i = 0; i < sizeof ga / sizeof ga[0]; i++) o->free(G, ga[i]);
    o->free(G, go16);
    free(qkv), free(dout);
}

static void test_act16(void) {
    /* F a multiple of 8 (the bf16-output GELU epilogue) and not (its fallback); attention
     * on the fp32 kernels (hd 16) and the tensor cores (hd 64) across their tiles */
    act16_case(37, 24, 64, (attn_geo){2, 33, 2, 1, 16, 0.0f, false});
    act16_case(5, 16, 20, (attn_geo){1, 17, 2, 2, 64, 0.1f, false});
    act16_case(130, 64, 256, (attn_geo){1, 65, 4, 2, 64, 0.0f, false});
    if (BIG) act16_case(2048, 768, 3072, (attn_geo){2, 1024, 12, 12, 64, 0.0f, false});
    /* fp32 mode refuses them (the model never calls them there) */
    GPU32->ops->norm_forward_bf16(GPU32, false, NULL, NULL, NULL, NULL, NULL, NULL, 0, 0, 1e-5f);
    CHECK(GPU32->status == 0); /* nothing to do: no error */
    uint16_t *x16 = GPU32->ops->alloc(GPU32, 64);
    float *o = gu_buf(GPU32, NULL, 64), *W = gu_buf(GPU32, NULL, 64);
    GPU32->ops->linear_forward_bf16(GPU32, o, x16, W, NULL, NULL, 2, 4, 4);
    CHECK_MSG(GPU32->status != 0, "linear_forward_bf16 ran in fp32 mode");
    kb_backend_clear_status(GPU32);
    GPU32->ops->free(GPU32, x16), GPU32->ops->free(GPU32, o), GPU32->ops->free(GPU32, W);
}

/* copy_rows (the MTP concatenation, its split, eh_proj's column slices): rows of a pitched
 * buffer into another, bitwise the CPU's (a plain copy) and the host's, the gaps between the
 * rows untouched; 4-byte words, bf16 elements (2-byte alignment) and bytes (odd offsets);
 * on the stand-in no host wait until the result is read */
static void copy_rows_case(size_t rows, size_t width, size_t spitch, size_t dpitch, size_t soff, size_t doff) {
    char label[160];
    snprintf(label, sizeof label, "copy_rows rows=%zu width=%zu pitches %zu/%zu offsets %zu/%zu", rows, width, spitch,
             dpitch, soff, doff);
    size_t sn = soff + rows * spitch, dn = doff + rows * dpitch;
    float *sf = gu_rand((sn + 3) / 4, 3.0f), *df = gu_rand((dn + 3) / 4, 3.0f);
    float *gs = gu_buf(GPU32, sf, (sn + 3) / 4), *gd = gu_buf(GPU32, df, (dn + 3) / 4);
    char *want = malloc(dn), *cpu = malloc(dn), *got = malloc(dn);
    memcpy(want, df, dn);
    memcpy(cpu, df, dn);
    for (size_t r = 0; r < rows; r++) memcpy(want + doff + r * dpitch, (char *)sf + soff + r * spitch, width);
    CPU32->ops->copy_rows(CPU32, cpu + doff, dpitch, (char *)sf + soff, spitch, width, rows);
    unsigned long s0 = sync_count ? sync_count() : 0;
    GPU32->ops->copy_rows(GPU32, (char *)gd + doff, dpitch, (char *)gs + soff, spitch, width, rows);
    if (sync_count) CHECK_MSG(sync_count() - s0 == 0, "%s: %lu host waits", label, sync_count() - s0);
    GPU32->ops->copy(GPU32, got, gd, dn);
    CHECK_MSG(GPU32->status == 0, "%s: status %d", label, GPU32->status);
    GU_EQUAL(label, cpu, want, dn);
    GU_EQUAL(label, got, want, dn);
    GPU32->ops->free(GPU32, gs), GPU32->ops->free(GPU32, gd);
    free(sf), free(df), free(want), free(cpu), free(got);
}

static void test_copy_rows(void) {
    copy_rows_case(37, 4 * 24, 4 * 24, 4 * 48, 0, 0);          /* [en | hn]: the left half */
    copy_rows_case(37, 4 * 24, 4 * 24, 4 * 48, 0, 4 * 24);     /* the right half */
    copy_rows_case(64, 4 * 16, 4 * 32, 4 * 16, 4 * 16, 0);     /* the split, a column slice */
    copy_rows_case(1000, 2 * 33, 2 * 66, 2 * 33, 2 * 33, 2);   /* bf16 elements */
    copy_rows_case(5, 7, 9, 11, 1, 3);                         /* bytes */
    copy_rows_case(3, 4 * 5, 4 * 5, 4 * 5, 0, 0);              /* contiguous */
    GPU32->ops->copy_rows(GPU32, NULL, 0, NULL, 0, 0, 5);      /* nothing to copy */
    GPU32->ops->copy_rows(GPU32, NULL, 0, NULL, 0, 8, 0);
    CHECK(GPU32->status == 0);
}

/* ---------------------------------------------------------------- ring attention's bookkeeping */

/* One LSE merge (kernels/cuda/cuda_ring.cu) against the CPU's: B sequences of L rows, the
 * step's rows q0..q0+nq, some rows of the step's block with no key seen (pl -inf: left
 * alone), some running rows with none yet (lse -inf). Bitwise on the stand-in (the same
 * libm), within an ulp's tolerance on a GPU; no host wait. */
static void merge_case(int B, int nh, int hd, int L, int q0, int nq) {
    char label[120];
    snprintf(label, sizeof label, "ring_merge B=%d nh=%d hd=%d L=%d q0=%d nq=%d", B, nh, hd, L, q0, nq);
    const size_t no = (size_t)B * L * nh * hd, nl = (size_t)B * nh * L, npo = (size_t)B * nq * nh * hd;
    const size_t npl = (size_t)B * nh * nq;
    float *out = gu_rand(no, 1.0f), *lse = gu_rand(nl, 3.0f), *po = gu_rand(npo, 1.0f), *pl = gu_rand(npl, 3.0f);
    for (size_t i = 0; i < npl; i += 7) pl[i] = -INFINITY;
    for (size_t i = 3; i < nl; i += 11) lse[i] = -INFINITY;
    float *go = gu_buf(GPU32, out, no), *gl = gu_buf(GPU32, lse, nl), *gpo = gu_buf(GPU32, po, npo);
    float *gpl = gu_buf(GPU32, pl, npl);
    GPU32->ops->sync(GPU32);
    unsigned long s0 = sync_count ? sync_count() : 0;
    GPU32->ops->ring_merge(GPU32, go, gl, gpo, gpl, B, nh, hd, L, q0, nq);
    if (sync_count) CHECK_MSG(sync_count() == s0, "%s: %lu host waits", label, sync_count() - s0);
    CPU32->ops->ring_merge(CPU32, out, lse, po, pl, B, nh, hd, L, q0, nq);
    char l2[160];
    float *h = gu_fetch(GPU32, go, no);
    snprintf(l2, sizeof l2, "%s out", label);
    if (!BIG) GU_EQUAL(l2, h, out, no * sizeof(float));
    GU_CLOSE(l2, h, out, no, 1e-6, 1e-5);
    free(h);
    h = gu_fetch(GPU32, gl, nl);
    size_t bad = 0;
    for (size_t i = 0; i < nl; i++)
        bad += isinf(lse[i]) ? !(isinf(h[i]) && h[i] < 0) : !(fabsf(h[i] - lse[i]) <= 1e-6f + 1e-6f * fabsf(lse[i]));
    CHECK_MSG(bad == 0, "%s lse: %zu of %zu differ", label, bad, nl);
    if (!BIG) GU_EQUAL(label, h, lse, nl * sizeof(float));
    free(h);
    float *gp[] = {go, gl, gpo, gpl};
    for (int i = 0; i < 4; i++) GPU32->ops->free(GPU32, gp[i]);
    free(out), free(lse), free(po), free(pl);
}

/* copy_rows (the ring's message packing, gathers and dK/dV scatter) and bf16_to_f32 (a bf16
 * attention output widened for the backward): bitwise the CPU's, queued without a host wait */
static void copy_case(size_t rows, size_t width, size_t sstride, size_t dstride) {
    char label[120];
    snprintf(label, sizeof label, "copy_rows rows=%zu width=%zu strides %zu %zu", rows, width, sstride, dstride);
    const size_t ns = rows * sstride, nd = rows * dstride;
    float *src = gu_rand(ns, 2.0f), *dst = gu_rand(nd, 1.0f);
    float *gs = gu_buf(GPU32, src, ns), *gd = gu_buf(GPU32, dst, nd);
    GPU32->ops->sync(GPU32);
    unsigned long s0 = sync_count ? sync_count() : 0;
    GPU32->ops->copy_rows(GPU32, gd, dstride * 4, gs, sstride * 4, width * 4, rows); /* (bytes) */
    if (sync_count) CHECK_MSG(sync_count() == s0, "%s: %lu host waits", label, sync_count() - s0);
    CPU32->ops->copy_rows(CPU32, dst, dstride * 4, src, sstride * 4, width * 4, rows);
    float *h = gu_fetch(GPU32, gd, nd);
    GU_EQUAL(label, h, dst, nd * sizeof(float)); /* (the gaps between rows kept too) */
    free(h);
    GPU32->ops->free(GPU32, gs), GPU32->ops->free(GPU32, gd);
    free(src), free(dst);
}

static void test_ring_ops(void) {
    merge_case(1, 1, 1, 2, 1, 1);
    merge_case(2, 3, 8, 66, 33, 33);   /* the upper half's rows (a step i > rank) */
    merge_case(2, 2, 33, 66, 0, 66);   /* every row (i <= rank), hd across a warp */
    merge_case(1, 4, 128, 130, 0, 65); /* the lower half; the backend's largest head */
    if (BIG) merge_case(4, 16, 128, 2048, 1024, 1024);
    copy_case(1, 1, 1, 1);
    copy_case(33, 31, 40, 33);
    copy_case(7, 257, 300, 257);
    copy_case(130, 64, 192, 64); /* K and V out of a packed qkv's rows */
    /* bf16 -> fp32: every bit pattern's widening */
    const size_t n = 65536;
    kb_bf16 *x = malloc(n * sizeof *x);
    float *want = malloc(n * sizeof *want);
    for (size_t i = 0; i < n; i++) x[i] = (kb_bf16)i;
    kb_bf16 *gx = GPU32->ops->alloc(GPU32, n * sizeof *gx);
    float *gy = gu_buf(GPU32, NULL, n);
    GPU32->ops->copy(GPU32, gx, x, n * sizeof *x);
    GPU32->ops->sync(GPU32);
    unsigned long s0 = sync_count ? sync_count() : 0;
    GPU32->ops->bf16_to_f32(GPU32, gy, gx, n);
    if (sync_count) CHECK_MSG(sync_count() == s0, "bf16_to_f32: %lu host waits", sync_count() - s0);
    CPU32->ops->bf16_to_f32(CPU32, want, x, n);
    float *h = gu_fetch(GPU32, gy, n);
    GU_EQUAL("bf16_to_f32", h, want, n * sizeof(float));
    uint32_t w;
    memcpy(&w, &want[0x3f80], sizeof w);
    CHECK_MSG(w == 0x3f800000u && want[0x3f80] == 1.0f, "bf16_to_f32: 0x3f80 is not 1.0");
    free(h), free(x), free(want);
    GPU32->ops->free(GPU32, gx), GPU32->ops->free(GPU32, gy);
    CHECK_MSG(GPU32->status == 0, "ring ops: status %d %s", GPU32->status, co_err_detail());
}

/* every entry the CPU backend has, the CUDA backend has too; the CPU has every entry but the
 * fused products (the model composes them there) and the streams, which CUDA has */
static void test_entries(void) {
    const size_t n = sizeof(kb_ops) / sizeof(void (*)(void));
    for (size_t i = 0; i < n; i++) {
        void (*c)(void), (*g)(void);
        memcpy(&c, (const char *)CPU32->ops + i * sizeof c, sizeof c);
        memcpy(&g, (const char *)GPU32->ops + i * sizeof g, sizeof g);
        CHECK_MSG(g != NULL, "kb_ops entry %zu is NULL on CUDA", i);
        bool fused = i * sizeof c == offsetof(kb_ops, linear_gelu_forward) ||
                     i * sizeof c == offsetof(kb_ops, linear_backward_dgelu);
        bool stream = i * sizeof c == offsetof(kb_ops, stream) || /* (the CPU has no stream, */
                      (i * sizeof c >= offsetof(kb_ops, side_stream) &&  /* nor a side one) */
                       i * sizeof c <= offsetof(kb_ops, side_join));
        /* the bf16-activation entries (CUDA's bf16 mode; the CPU rounds per product) */
        bool act16 = i * sizeof c >= offsetof(kb_ops, norm_forward_bf16) &&
                     i * sizeof c <= offsetof(kb_ops, attention_backward_bf16);
        CHECK_MSG(c != NULL || fused || stream || act16, "kb_ops entry %zu is NULL on the CPU", i);
    }
}

int main(void) {
    const char *standin = getenv("COHORT_TEST_STANDIN");
    BIG = !(standin && standin[0] == '1');
    char why[256];
    if (!BIG && !kb_cuda_available(why, sizeof why)) { /* never a skip: the stand-in must load here */
        fprintf(stderr, "the CUDA stand-in did not load (COHORT_CUDA_MODULE=%s): %s\n",
                getenv("COHORT_CUDA_MODULE") ? getenv("COHORT_CUDA_MODULE") : "(unset)", why);
        return 1;
    }
    gu_require_gpu();
    CPU32 = gu_backend(KB_DEVICE_CPU, false);
    CPU16 = gu_backend(KB_DEVICE_CPU, true); /* bf16_reference: any CPU */
    fprintf(stderr, "%s\n", kb_backend_describe(CPU16));
    GPU32 = gu_backend(KB_DEVICE_CUDA, false);
    GPU16 = gu_backend(KB_DEVICE_CUDA, true);
    fprintf(stderr, "%s\n%s\n", kb_backend_describe(GPU32), kb_backend_describe(GPU16));
    RUN(test_memory);
    RUN(test_entries);
    RUN(test_linear);
    RUN(test_linear_bias_alignment);
    RUN(test_linear_gelu);
    RUN(test_embed);
    RUN(test_norm);
    RUN(test_rope);
    RUN(test_attention);
    RUN(test_attention_tensor_cores);
    RUN(test_block_attention);
    RUN(test_activations);
    RUN(test_cross_entropy);
    RUN(test_tensor_parallel);
    RUN(test_optimizer);
    find_sync_count();
    if (!BIG) CHECK_MSG(sync_count != NULL, "the stand-in has no cudasim_sync_count");
    RUN(test_checksum);
    RUN(test_ring_ops);
    RUN(test_grouped);
    RUN(test_act16);
    RUN(test_copy_rows);
    RUN(test_swiglu16);
    RUN(test_moe_permutations);
    CHECK_MSG(GPU32->status == 0 && GPU16->status == 0, "sticky status: %d %d (%s)", GPU32->status, GPU16->status,
              co_err_detail());
    kb_backend_destroy(&GPU32);
    kb_backend_destroy(&GPU16);
    kb_backend_destroy(&CPU32);
    kb_backend_destroy(&CPU16);
    return TEST_EXIT();
}
