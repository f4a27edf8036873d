/* test_ring_attention.c - ring attention (model/ring_attention.c) in one process, cp threads
 * simulating cp ranks (ring_sim): the reassembled out, lse and dqkv for cp = 1, 2, 4 match
 * the one-rank causal kernel (kb_ops.attention_forward/backward) on the full sequence, with
 * GQA and with documents that cross chunk boundaries; bitwise repeatable; the split and its
 * refusals (seq % (2*cp) != 0). Prints the measured errors. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "common/error.h"
#include "kernels/backend.h"
#include "model/ring_attention.h"
#include "tests/unit/kernels/kt_util.h"

/* stated tolerance (fp32): |a - ref| <= ATOL + RTOL * |ref| */
#define ATOL 2e-5
#define RTOL 1e-4

typedef struct prob {
    int B, seq, nh, nkv, hd;
    float *qkv, *dout;     /* full: [B*seq, R], [B*seq, nh*hd] */
    int32_t *seg;          /* full: [B*seq] document start, or NULL */
    float *out, *lse, *dqkv; /* reference from the one-rank kernel */
} prob;

static size_t R_of(const prob *p) { return (size_t)(p->nh + 2 * p->nkv) * p->hd; }

static void prob_init(prob *p, kb_backend *b, int B, int seq, int nh, int nkv, int hd,
                      int docs) {
    *p = (prob){.B = B, .seq = seq, .nh = nh, .nkv = nkv, .hd = hd};
    const size_t N = (size_t)B * seq, R = R_of(p), C = (size_t)nh * hd;
    p->qkv = kt_rand(N * R, 1.0f);
    p->dout = kt_rand(N * C, 1.0f);
    if (docs) {
        /* documents start at irregular places so they cross chunk boundaries; sequence 1
         * has a different layout, including a one-token document */
        p->seg = malloc(N * sizeof(int32_t));
        for (int bb = 0; bb < B; bb++) {
            int start = 0;
            for (int t = 0; t < seq; t++) {
                if (bb % 2 == 0 ? (t == 5 || t == 17 || t == 30 || t == 41)
                                : (t == 11 || t == 12 || t == 37))
                    start = t;
                p->seg[(size_t)bb * seq + t] = start;
            }
        }
    }
    p->out = malloc(N * C * sizeof(float));
    p->lse = malloc((size_t)B * nh * seq * sizeof(float));
    p->dqkv = malloc(N * R * sizeof(float));
    b->ops->attention_forward(b, p->out, p->lse, p->qkv, p->seg, B, seq, nh, nkv, hd, 0.0f, 0, 0);
    b->ops->attention_backward(b, p->dqkv, p->dout, p->qkv, p->out, p->lse, p->seg, B, seq, nh,
                               nkv, hd, 0.0f, 0, 0);
    REQUIRE(kb_backend_status(b) == 0);
}

static void prob_free(prob *p) {
    free(p->qkv), free(p->dout), free(p->seg), free(p->out), free(p->lse), free(p->dqkv);
}

/* setup that cannot fail in a working build (test code: stop here) */
#define MUST(cond)                                                                 \
    do {                                                                           \
        if (!(cond)) {                                                             \
            fprintf(stderr, "%s:%d: setup failed: %s\n", __FILE__, __LINE__, #cond); \
            exit(1);                                                               \
        }                                                                          \
    } while (0)

/* one simulated rank */
typedef struct rank_job {
    const prob *p;
    int cp, rank;
    ring_sim *sim;
    float *qkv, *dout, *out, *lse, *dqkv; /* local */
    int32_t *doc;
    int rc;
} rank_job;

static void *rank_main(void *arg) {
    rank_job *j = arg;
    const prob *p = j->p;
    kb_backend *b = kt_backend(1, false);
    ring_exchange x;
    ring_sim_exchange(j->sim, j->rank, &x);
    ring_geo g = {.cp = j->cp, .rank = j->rank, .B = p->B, .seq = p->seq, .nh = p->nh,
                  .nkv = p->nkv, .hd = p->hd};
    j->rc = ring_attention_forward(b, &x, &g, j->out, j->lse, j->qkv, j->doc);
    if (!j->rc)
        j->rc = ring_attention_backward(b, &x, &g, j->dqkv, j->dout, j->qkv, j->out, j->lse,
                                        j->doc);
    if (j->rc) {
        fprintf(stderr, "rank %d: %s: %s\n", j->rank, co_err_name(j->rc), co_err_detail());
        ring_sim_abort(j->sim);
    }
    kb_backend_destroy(&b);
    return NULL;
}

/* Runs the ring for cp ranks; out/lse/dqkv reassembled to full layout. 0 or a code. */
static int run_ring(const prob *p, int cp, float *out, float *lse, float *dqkv) {
    const int B = p->B, seq = p->seq, L = seq / cp, nh = p->nh;
    const size_t R = R_of(p), C = (size_t)nh * p->hd;
    ring_sim *sim = NULL;
    MUST(ring_sim_new(&sim, cp, 60000) == 0);
    rank_job *jobs = calloc((size_t)cp, sizeof *jobs);
    pthread_t *th = calloc((size_t)cp, sizeof *th);
    for (int r = 0; r < cp; r++) {
        rank_job *j = &jobs[r];
        *j = (rank_job){.p = p, .cp = cp, .rank = r, .sim = sim};
        j->qkv = malloc((size_t)B * L * R * sizeof(float));
        j->dout = malloc((size_t)B * L * C * sizeof(float));
        j->out = malloc((size_t)B * L * C * sizeof(float));
        j->lse = malloc((size_t)B * nh * L * sizeof(float));
        j->dqkv = malloc((size_t)B * L * R * sizeof(float));
        MUST(ring_split_rows(j->qkv, p->qkv, R * sizeof(float), B, seq, cp, r) == 0);
        MUST(ring_split_rows(j->dout, p->dout, C * sizeof(float), B, seq, cp, r) == 0);
        if (p->seg) {
            j->doc = malloc((size_t)B * L * sizeof(int32_t));
            MUST(ring_split_rows(j->doc, p->seg, sizeof(int32_t), B, seq, cp, r) == 0);
        }
        MUST(pthread_create(&th[r], NULL, rank_main, j) == 0);
    }
    int rc = 0;
    int32_t *pos = malloc((size_t)L * sizeof(int32_t));
    for (int r = 0; r < cp; r++) {
        pthread_join(th[r], NULL);
        rank_job *j = &jobs[r];
        if (j->rc && !rc) rc = j->rc;
        MUST(ring_unsplit_rows(out, j->out, C * sizeof(float), B, seq, cp, r) == 0);
        MUST(ring_unsplit_rows(dqkv, j->dqkv, R * sizeof(float), B, seq, cp, r) == 0);
        MUST(ring_positions(pos, seq, cp, r) == 0);
        for (int bh = 0; bh < B * nh; bh++)
            for (int t = 0; t < L; t++) lse[(size_t)bh * seq + pos[t]] = j->lse[(size_t)bh * L + t];
        free(j->qkv), free(j->dout), free(j->out), free(j->lse), free(j->dqkv), free(j->doc);
    }
    free(pos);
    free(jobs);
    free(th);
    ring_sim_free(&sim);
    return rc;
}

/* max abs error, max error relative to |ref|, and worst (err / (ATOL + RTOL |ref|)) */
static double compare(const char *what, const float *a, const float *ref, size_t n) {
    double mabs = 0, mrel = 0, worst = 0;
    for (size_t i = 0; i < n; i++) {
        const double e = fabs((double)a[i] - ref[i]), r = fabs((double)ref[i]);
        if (e > mabs) mabs = e;
        if (r > 1e-3 && e / r > mrel) mrel = e / r;
        const double w = e / (ATOL + RTOL * r);
        if (!(w <= worst)) worst = w; /* NaN counts as worst */
    }
    printf("    %-5s max abs %.3g, max rel (|ref| > 1e-3) %.3g, worst/tol %.3f\n", what, mabs,
           mrel, worst);
    return worst;
}

static void check_case(int B, int seq, int nh, int nkv, int hd, int docs) {
    kb_backend *b = kt_backend(2, false);
    prob p;
    prob_init(&p, b, B, seq, nh, nkv, hd, docs);
    const size_t N = (size_t)B * seq, R = R_of(&p), C = (size_t)nh * hd;
    float *out = malloc(N * C * sizeof(float)), *lse = malloc((size_t)B * nh * seq * sizeof(float));
    float *dqkv = malloc(N * R * sizeof(float));
    float *out2 = malloc(N * C * sizeof(float)), *lse2 = malloc((size_t)B * nh * seq * sizeof(float));
    float *dqkv2 = malloc(N * R * sizeof(float));
    const int cps[] = {1, 2, 4};
    for (int k = 0; k < 3; k++) {
        const int cp = cps[k];
        printf("  B %d seq %d nh %d nkv %d hd %d docs %d cp %d\n", B, seq, nh, nkv, hd, docs, cp);
        REQUIRE(run_ring(&p, cp, out, lse, dqkv) == 0);
        CHECK(compare("out", out, p.out, N * C) <= 1.0);
        CHECK(compare("lse", lse, p.lse, (size_t)B * nh * seq) <= 1.0);
        CHECK(compare("dqkv", dqkv, p.dqkv, N * R) <= 1.0);
        /* run to run: the same bits */
        REQUIRE(run_ring(&p, cp, out2, lse2, dqkv2) == 0);
        CHECK(memcmp(out, out2, N * C * sizeof(float)) == 0);
        CHECK(memcmp(lse, lse2, (size_t)B * nh * seq * sizeof(float)) == 0);
        CHECK(memcmp(dqkv, dqkv2, N * R * sizeof(float)) == 0);
    }
    free(out), free(lse), free(dqkv), free(out2), free(lse2), free(dqkv2);
    prob_free(&p);
    kb_backend_destroy(&b);
}

static void test_ring_plain(void) { check_case(2, 48, 4, 2, 16, 0); }
static void test_ring_docs(void) { check_case(2, 48, 4, 2, 16, 1); }
static void test_ring_mha_docs(void) { check_case(1, 64, 2, 2, 8, 1); }
static void test_ring_mqa(void) { check_case(1, 40, 4, 1, 12, 1); }

static void test_split(void) {
    int32_t pos[8];
    /* seq 16, cp 2: chunks of 4; rank 0 keeps chunks 0 and 3, rank 1 chunks 1 and 2 */
    REQUIRE(ring_positions(pos, 16, 2, 0) == 0);
    const int32_t want0[8] = {0, 1, 2, 3, 12, 13, 14, 15};
    CHECK(memcmp(pos, want0, sizeof want0) == 0);
    REQUIRE(ring_positions(pos, 16, 2, 1) == 0);
    const int32_t want1[8] = {4, 5, 6, 7, 8, 9, 10, 11};
    CHECK(memcmp(pos, want1, sizeof want1) == 0);
    /* split then unsplit over all ranks gives back the tensor */
    int32_t full[2 * 24], back[2 * 24], loc[2 * 6];
    for (int i = 0; i < 48; i++) full[i] = i * 7 + 1;
    memset(back, 0, sizeof back);
    for (int r = 0; r < 4; r++) {
        REQUIRE(ring_split_rows(loc, full, sizeof(int32_t), 2, 24, 4, r) == 0);
        REQUIRE(ring_unsplit_rows(back, loc, sizeof(int32_t), 2, 24, 4, r) == 0);
    }
    CHECK(memcmp(full, back, sizeof full) == 0);
}

static void test_refusals(void) {
    /* seq % (2*cp) != 0 is refused with a clear error, before any exchange */
    CHECK(ring_positions((int32_t[16]){0}, 12, 4, 0) == CO_EINVAL);
    CHECK(strstr(co_err_detail(), "not divisible by 2 * context-parallel-size = 8") != NULL);
    ring_geo g = {.cp = 2, .rank = 0, .B = 1, .seq = 12, .nh = 2, .nkv = 1, .hd = 4};
    CHECK(ring_check(&g) == 0);
    g.seq = 10;
    CHECK(ring_check(&g) == CO_EINVAL);
    g.seq = 12, g.cp = 4;
    kb_backend *b = kt_backend(1, false);
    ring_sim *sim = NULL;
    REQUIRE(ring_sim_new(&sim, 4, 1000) == 0);
    ring_exchange x;
    ring_sim_exchange(sim, 0, &x);
    float buf[64] = {0};
    CHECK(ring_attention_forward(b, &x, &g, buf, buf, buf, NULL) == CO_EINVAL);
    CHECK(strstr(co_err_detail(), "ring_attention_forward") != NULL);
    CHECK(ring_attention_backward(b, &x, &g, buf, buf, buf, buf, buf, NULL) == CO_EINVAL);
    g.seq = 16, g.rank = 4;
    CHECK(ring_check(&g) == CO_EINVAL);
    /* a rank alone at a shift times out instead of hanging */
    g.rank = 0;
    char s1[8] = {0}, r1[8];
    CHECK(x.shift(x.ctx, s1, r1, sizeof s1) == CO_ETIMEOUT);
    ring_sim_free(&sim);
    kb_backend_destroy(&b);
}

int main(void) {
    RUN(test_split);
    RUN(test_refusals);
    RUN(test_ring_plain);
    RUN(test_ring_docs);
    RUN(test_ring_mha_docs);
    RUN(test_ring_mqa);
    return TEST_EXIT();
}
