/* test_ring_attention.c - ring attention (model/ring_attention.c) in one process, cp threads
 * simulating cp ranks (ring_sim): the reassembled out, lse and dqkv for cp = 1, 2, 3, 4 match
 * the one-rank causal kernel (kb_ops.attention_forward/backward) on the full sequence, with
 * GQA and with documents that cross chunk boundaries; bitwise repeatable; the split and its
 * refusals (seq % (2*cp) != 0); and over cohort's comm (cm_zmq, forked ranks) for cp = 2 and
 * 3, bitwise equal to the one-process result; the block kernels bitwise equal at 1 and 3
 * threads; the bf16-output forms (bf16 activations) against the fp32 ones, bitwise. Prints
 * the measured errors. */
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <signal.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "comm/zmq_comm.h"
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

/* the inputs only (what a forked rank regenerates: the same bits from the same seed) */
static void prob_inputs(prob *p, int B, int seq, int nh, int nkv, int hd, int docs) {
    kt__rng = 0x1234567887654321ull ^ ((uint64_t)seq << 32) ^ (uint64_t)(nh * 64 + nkv * 8 + hd);
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
}

static void prob_init(prob *p, kb_backend *b, int B, int seq, int nh, int nkv, int hd,
                      int docs) {
    prob_inputs(p, B, seq, nh, nkv, hd, docs);
    const size_t N = (size_t)B * seq, R = R_of(p), C = (size_t)nh * hd;
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
    int act16; /* also the bf16-output forms (rank_act16) */
    int rc;
    int bad;   /* act16: the bf16 forms' results differ from the fp32 forms' (a count) */
} rank_job;

/* The bf16-output forms on one rank, after the fp32 forms wrote j->out, j->lse, j->dqkv, with
 * one workspace for both calls: out16 must be the fp32 output rounded once (to_bf16) and lse
 * the same bits; the backward from out16 the fp32 backward's bits from out16 widened. */
static int rank_act16(rank_job *j, kb_backend *b, const ring_exchange *x, const ring_geo *g) {
    const int L = g->seq / g->cp;
    const size_t no = (size_t)g->B * L * g->nh * g->hd, nl = (size_t)g->B * g->nh * L;
    const size_t nd = (size_t)g->B * L * (g->nh + 2 * g->nkv) * g->hd;
    kb_bf16 *o16 = malloc(no * sizeof *o16), *want16 = malloc(no * sizeof *want16);
    float *lse = malloc(nl * sizeof(float)), *ow = malloc(no * sizeof(float));
    float *d16 = malloc(nd * sizeof(float)), *dref = malloc(nd * sizeof(float));
    ring_ws *ws = ring_ws_new();
    MUST(o16 && want16 && lse && ow && d16 && dref && ws);
    int rc = ring_attention_forward_ws(b, ws, x, g, NULL, o16, lse, j->qkv, j->doc);
    if (!rc) rc = ring_attention_backward_ws(b, ws, x, g, d16, j->dout, j->qkv, NULL, o16, lse, j->doc);
    b->ops->bf16_to_f32(b, ow, o16, no);
    if (!rc) rc = ring_attention_backward(b, x, g, dref, j->dout, j->qkv, ow, j->lse, j->doc);
    b->ops->to_bf16(b, want16, j->out, no);
    j->bad = (memcmp(o16, want16, no * sizeof *o16) != 0) + (memcmp(lse, j->lse, nl * sizeof(float)) != 0) +
             (memcmp(d16, dref, nd * sizeof(float)) != 0);
    ring_ws_free(&ws);
    free(o16), free(want16), free(lse), free(ow), free(d16), free(dref);
    return rc;
}

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
    if (!j->rc && j->act16) j->rc = rank_act16(j, b, &x, &g);
    if (j->rc) {
        fprintf(stderr, "rank %d: %s: %s\n", j->rank, co_err_name(j->rc), co_err_detail());
        ring_sim_abort(j->sim);
    }
    kb_backend_destroy(&b);
    return NULL;
}

/* Runs the ring for cp ranks; out/lse/dqkv reassembled to full layout. 0 or a code. With
 * act16 the ranks check the bf16-output forms too, *bad their mismatches. */
static int run_ring_mode(const prob *p, int cp, float *out, float *lse, float *dqkv, int act16, int *bad) {
    const int B = p->B, seq = p->seq, L = seq / cp, nh = p->nh;
    const size_t R = R_of(p), C = (size_t)nh * p->hd;
    ring_sim *sim = NULL;
    MUST(ring_sim_new(&sim, cp, 60000) == 0);
    rank_job *jobs = calloc((size_t)cp, sizeof *jobs);
    pthread_t *th = calloc((size_t)cp, sizeof *th);
    for (int r = 0; r < cp; r++) {
        rank_job *j = &jobs[r];
        *j = (rank_job){.p = p, .cp = cp, .rank = r, .sim = sim, .act16 = act16};
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
        if (bad) *bad += j->bad;
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

static int run_ring(const prob *p, int cp, float *out, float *lse, float *dqkv) {
    return run_ring_mode(p, cp, out, lse, dqkv, 0, NULL);
}

/* bf16 activations under context parallelism (model/gpt_cp.c): attention's output rounded
 * once after the last merge, and the backward's D from its bf16 values, on every rank of cp
 * 2 and 3 with documents (ring_attention_*_ws against the fp32 forms, bitwise) */
static void test_ring_act16(void) {
    kb_backend *b = kt_backend(1, false);
    prob p;
    prob_init(&p, b, 2, 48, 4, 2, 16, 1);
    const size_t N = (size_t)p.B * p.seq;
    float *out = malloc(N * 64 * sizeof(float)), *lse = malloc(N * 4 * sizeof(float));
    float *dqkv = malloc(N * R_of(&p) * sizeof(float));
    for (int cp = 2; cp <= 3; cp++) {
        int bad = 0;
        REQUIRE(run_ring_mode(&p, cp, out, lse, dqkv, 1, &bad) == 0);
        CHECK_MSG(bad == 0, "cp %d: %d results of the bf16 forms differ from the fp32 forms'", cp, bad);
    }
    free(out), free(lse), free(dqkv);
    prob_free(&p);
    kb_backend_destroy(&b);
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
    /* 1, 2, 4, and an odd ring (3) where the length allows */
    const int cps[] = {1, 2, 3, 4};
    for (int k = 0; k < 4; k++) {
        const int cp = cps[k];
        if (seq % (2 * cp)) continue;
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
/* local blocks of several 64-row tiles of the block kernels, with partial last tiles */
static void test_ring_long(void) { check_case(1, 312, 4, 2, 64, 1); }

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
    /* a backend without block attention (CUDA so far: NULL pointers) is refused */
    g.seq = 16, g.rank = 0;
    kb_ops nob = *b->ops;
    nob.block_attention_forward = NULL;
    nob.block_attention_backward = NULL;
    const kb_ops *saved = b->ops;
    b->ops = &nob;
    CHECK(ring_attention_forward(b, &x, &g, buf, buf, buf, NULL) == CO_EUNSUPPORTED);
    CHECK(ring_attention_backward(b, &x, &g, buf, buf, buf, buf, buf, NULL) == CO_EUNSUPPORTED);
    b->ops = saved;
    /* the block kernel refuses a causal mask over different token counts */
    kb_block_attn a = {.B = 1, .Tq = 2, .Tk = 3, .nh = 1, .nkv = 1, .hd = 4,
                       .mask = KB_BLOCK_MASK_CAUSAL, .q = buf, .k = buf, .v = buf,
                       .q_stride = 4, .k_stride = 4, .v_stride = 4};
    b->ops->block_attention_forward(b, &a, buf, buf);
    CHECK(kb_backend_status(b) == CO_EINVAL);
    CHECK(strstr(co_err_detail(), "causal") != NULL);
    kb_backend_clear_status(b);
    /* a rank alone at a shift times out instead of hanging */
    g.rank = 0;
    char s1[8] = {0}, r1[8];
    CHECK(x.shift(x.ctx, s1, r1, sizeof s1) == CO_ETIMEOUT);
    ring_sim_free(&sim);
    kb_backend_destroy(&b);
}

/* ---- over cohort's comm: cp forked-and-exec'd processes (this binary with --cp-rank), the
 * ZeroMQ communicator on ipc endpoints; the reassembled result must equal ring_sim's bits ---- */

#define MP_B 2
#define MP_SEQ 48
#define MP_NH 4
#define MP_NKV 2
#define MP_HD 16

/* a child rank: runs the ring over cm_zmq and writes out, lse, dqkv (local) to DIR/r<rank>.bin */
static int child_main(int cp, int rank, const char *dir) {
    prob p;
    prob_inputs(&p, MP_B, MP_SEQ, MP_NH, MP_NKV, MP_HD, 1);
    const int L = p.seq / cp;
    const size_t R = R_of(&p), C = (size_t)p.nh * p.hd, N = (size_t)p.B * L;
    float *qkv = malloc(N * R * 4), *dout = malloc(N * C * 4), *out = malloc(N * C * 4);
    float *lse = malloc((size_t)p.B * p.nh * L * 4), *dqkv = malloc(N * R * 4);
    int32_t *doc = malloc(N * 4);
    MUST(ring_split_rows(qkv, p.qkv, R * 4, p.B, p.seq, cp, rank) == 0);
    MUST(ring_split_rows(dout, p.dout, C * 4, p.B, p.seq, cp, rank) == 0);
    MUST(ring_split_rows(doc, p.seg, 4, p.B, p.seq, cp, rank) == 0);
    char eps[8][160];
    const char *ep[8];
    for (int r = 0; r < cp; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/ep%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.connect_timeout_ms = 20000;
    zo.linger_ms = 1000;
    zo.chunk_bytes = 4096; /* the KV messages (8-24 KiB here) go in several chunks */
    zo.small_bytes = 256;
    cm_comm *c = NULL;
    int rc = cm_zmq_new(&c, rank, cp, ep, &zo);
    if (rc) {
        fprintf(stderr, "rank %d: cm_zmq_new: %s\n", rank, co_err_detail());
        return 1;
    }
    kb_backend *b = kt_backend(1, false);
    ring_comm rcm = {.c = c, .timeout_ms = 30000};
    ring_exchange x;
    ring_exchange_comm(&x, &rcm);
    ring_geo g = {.cp = cp, .rank = rank, .B = p.B, .seq = p.seq, .nh = p.nh, .nkv = p.nkv,
                  .hd = p.hd};
    rc = ring_attention_forward(b, &x, &g, out, lse, qkv, doc);
    if (!rc) rc = ring_attention_backward(b, &x, &g, dqkv, dout, qkv, out, lse, doc);
    if (rc) {
        fprintf(stderr, "rank %d: %s: %s\n", rank, co_err_name(rc), co_err_detail());
        return 1;
    }
    char path[256];
    snprintf(path, sizeof path, "%s/r%d.bin", dir, rank);
    FILE *f = fopen(path, "wb");
    if (!f) return 1;
    fwrite(out, 4, N * C, f);
    fwrite(lse, 4, (size_t)p.B * p.nh * L, f);
    fwrite(dqkv, 4, N * R, f);
    fclose(f);
    cm_destroy(&c);
    kb_backend_destroy(&b);
    free(qkv), free(dout), free(out), free(lse), free(dqkv), free(doc);
    prob_free(&p);
    return 0;
}

static void check_comm(int cp) {
    prob p;
    kb_backend *b = kt_backend(2, false);
    prob_init(&p, b, MP_B, MP_SEQ, MP_NH, MP_NKV, MP_HD, 1);
    kb_backend_destroy(&b);
    const int L = p.seq / cp;
    const size_t R = R_of(&p), C = (size_t)p.nh * p.hd, N = (size_t)p.B * p.seq;
    const size_t nl = (size_t)p.B * p.nh * p.seq;
    float *out = malloc(N * C * 4), *lse = malloc(nl * 4), *dqkv = malloc(N * R * 4);
    MUST(run_ring(&p, cp, out, lse, dqkv) == 0);
    char dir[] = "/tmp/ringtest-XXXXXX";
    REQUIRE(mkdtemp(dir) != NULL);
    pid_t pid[8];
    fflush(stdout);
    fflush(stderr);
    for (int r = 0; r < cp; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            char a1[16], a2[16];
            snprintf(a1, sizeof a1, "%d", cp);
            snprintf(a2, sizeof a2, "%d", r);
            execl("/proc/self/exe", "test_ring_attention", "--cp-rank", a1, a2, dir, (char *)NULL);
            _exit(127);
        }
    }
    /* bounded wait: a hang is a failure and the children are killed */
    int left = cp, bad = 0, st;
    const int64_t dl = t_now_ms() + 90000;
    bool done[8] = {0};
    while (left) {
        for (int r = 0; r < cp; r++)
            if (!done[r] && waitpid(pid[r], &st, WNOHANG) == pid[r]) {
                done[r] = true, left--;
                if (!WIFEXITED(st) || WEXITSTATUS(st)) bad++;
            }
        if (left && t_now_ms() > dl) {
            for (int r = 0; r < cp; r++)
                if (!done[r]) kill(pid[r], SIGKILL);
            fprintf(stderr, "ring over comm, cp %d: ranks hung, killed\n", cp);
            bad++;
            for (int r = 0; r < cp; r++)
                if (!done[r]) waitpid(pid[r], &st, 0);
            break;
        }
        if (left) usleep(5000);
    }
    CHECK(bad == 0);
    float *mout = malloc(N * C * 4), *mlse = malloc(nl * 4), *mdqkv = malloc(N * R * 4);
    float *lo = malloc((size_t)p.B * L * C * 4), *ll = malloc((size_t)p.B * p.nh * L * 4);
    float *ld = malloc((size_t)p.B * L * R * 4);
    int32_t *pos = malloc((size_t)L * 4);
    for (int r = 0; r < cp && !bad; r++) {
        char path[256];
        snprintf(path, sizeof path, "%s/r%d.bin", dir, r);
        FILE *f = fopen(path, "rb");
        REQUIRE(f != NULL);
        CHECK(fread(lo, 4, (size_t)p.B * L * C, f) == (size_t)p.B * L * C);
        CHECK(fread(ll, 4, (size_t)p.B * p.nh * L, f) == (size_t)p.B * p.nh * L);
        CHECK(fread(ld, 4, (size_t)p.B * L * R, f) == (size_t)p.B * L * R);
        fclose(f);
        remove(path);
        MUST(ring_unsplit_rows(mout, lo, C * 4, p.B, p.seq, cp, r) == 0);
        MUST(ring_unsplit_rows(mdqkv, ld, R * 4, p.B, p.seq, cp, r) == 0);
        MUST(ring_positions(pos, p.seq, cp, r) == 0);
        for (int bh = 0; bh < p.B * p.nh; bh++)
            for (int t = 0; t < L; t++) mlse[(size_t)bh * p.seq + pos[t]] = ll[(size_t)bh * L + t];
    }
    if (!bad) {
        printf("  over cm_comm, cp %d: bitwise equal to ring_sim: out %d lse %d dqkv %d\n", cp,
               !memcmp(out, mout, N * C * 4), !memcmp(lse, mlse, nl * 4),
               !memcmp(dqkv, mdqkv, N * R * 4));
        CHECK(memcmp(out, mout, N * C * 4) == 0);
        CHECK(memcmp(lse, mlse, nl * 4) == 0);
        CHECK(memcmp(dqkv, mdqkv, N * R * 4) == 0);
    }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd) != 0) fprintf(stderr, "could not remove %s\n", dir);
    free(out), free(lse), free(dqkv), free(mout), free(mlse), free(mdqkv);
    free(lo), free(ll), free(ld), free(pos);
    prob_free(&p);
}

/* the block kernels give the same bits at any thread count */
static void test_block_threads(void) {
    const int B = 2, Tq = 37, Tk = 29, nh = 4, nkv = 2, hd = 12;
    const size_t nq = (size_t)B * Tq * nh * hd, nk = (size_t)B * Tk * nkv * hd;
    float *q = kt_rand(nq, 1.0f), *k = kt_rand(nk, 1.0f), *v = kt_rand(nk, 1.0f);
    float *dout = kt_rand(nq, 1.0f);
    int32_t *qd = malloc((size_t)B * Tq * 4), *kd = malloc((size_t)B * Tk * 4);
    for (int i = 0; i < B * Tq; i++) qd[i] = kt_randint(3);
    for (int i = 0; i < B * Tk; i++) kd[i] = kt_randint(3);
    float *res[2][5];
    const int threads[2] = {1, 3};
    for (int r = 0; r < 2; r++) {
        kb_backend *b = kt_backend(threads[r], false);
        kb_block_attn a = {.B = B, .Tq = Tq, .Tk = Tk, .nh = nh, .nkv = nkv, .hd = hd,
                           .mask = KB_BLOCK_MASK_NONE, .q = q, .k = k, .v = v,
                           .q_stride = (size_t)nh * hd, .k_stride = (size_t)nkv * hd,
                           .v_stride = (size_t)nkv * hd, .qdoc = qd, .kdoc = kd};
        res[r][0] = malloc(nq * 4), res[r][1] = malloc((size_t)B * nh * Tq * 4);
        res[r][2] = calloc(nq, 4), res[r][3] = calloc(nk, 4), res[r][4] = calloc(nk, 4);
        b->ops->block_attention_forward(b, &a, res[r][0], res[r][1]);
        b->ops->block_attention_backward(b, &a, res[r][0], res[r][1], dout, res[r][2], a.q_stride,
                                         res[r][3], a.k_stride, res[r][4], a.v_stride);
        CHECK(kb_backend_status(b) == 0);
        kb_backend_destroy(&b);
    }
    const size_t n[5] = {nq, (size_t)B * nh * Tq, nq, nk, nk};
    for (int i = 0; i < 5; i++) {
        CHECK(memcmp(res[0][i], res[1][i], n[i] * 4) == 0);
        free(res[0][i]), free(res[1][i]);
    }
    free(q), free(k), free(v), free(dout), free(qd), free(kd);
}

/* c = 2, and an odd ring (3: two even ranks next to each other) for the send/recv order */
static void test_ring_comm_2(void) { check_comm(2); }
static void test_ring_comm_3(void) { check_comm(3); }

int main(int argc, char **argv) {
    if (argc == 5 && !strcmp(argv[1], "--cp-rank"))
        return child_main(atoi(argv[2]), atoi(argv[3]), argv[4]);
    RUN(test_split);
    RUN(test_refusals);
    RUN(test_block_threads);
    RUN(test_ring_plain);
    RUN(test_ring_docs);
    RUN(test_ring_mha_docs);
    RUN(test_ring_mqa);
    RUN(test_ring_long);
    RUN(test_ring_act16);
    RUN(test_ring_comm_2);
    RUN(test_ring_comm_3);
    return TEST_EXIT();
}
