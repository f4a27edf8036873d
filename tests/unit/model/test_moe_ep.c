/* test_moe_ep.c - expert parallelism of the MoE layer (model/moe_ep.c) on forked ranks over
 * cohort's ZeroMQ comm, against the layer on one rank (ep 1, every expert local).
 *
 * Every rank r of an expert group of P holds its own tokens x_r. The reference: the ep-1
 * layer run on each x_s with the full parameters (each rank computes all of them, the
 * inputs are deterministic). With the experts split over P ranks (alltoall and allgather
 * dispatchers) each rank must find
 *   y_r and dx_r: its own tokens' output and input gradient, equal to the reference's on x_r;
 *   the router's gradient: the reference's on x_r (the router is replicated, its gradient
 *     local until the data-parallel all-reduce);
 *   its experts' gradients: the sum over s of the reference's for those experts (the expert
 *     weights live on one rank of the group and see every rank's tokens);
 *   the aux and z losses, the tokens per expert and the drops: the reference's on x_r;
 * within FP32_TOL (the experts' products now run over the rows of several ranks at once,
 * the allgather dispatcher sums the experts of a token in rank order), and bitwise the same
 * when run twice. Configurations: softmax top-2 with the aux loss, sigmoid top-3 with the
 * expert bias, a capacity with drops, padding to capacity, a shared expert and SwiGLU with
 * the grouped products, the z loss, and uneven token counts per rank (alltoall only; allgather needs equal counts).
 * With the experts split over etp ranks too (moe_config.etp_size, a group of etp x ep
 * members): each member's expert gradients are its slice of the group's sum (every member of
 * an expert rank sees every token routed to its experts), the rest as above. */
#include "model/moe.h"

#include "comm/zmq_comm.h"
#include "common/error.h"
#include "common/rng.h"
#include "tests/test.h"
#include "tests/fork_ranks.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

#define FP32_TOL 2e-5

typedef struct ep_case {
    const char *name;
    moe_config c;
    int P;
    moe_dispatcher d;
    bool uneven; /* rank r routes (B, T + r) tokens: alltoall only */
    int etp;     /* > 1: the experts split over etp ranks, P = etp x expert ranks */
} ep_case;

static kb_backend *backend(void) {
    kb_backend *be = NULL;
    kb_options o = {.device = KB_DEVICE_CPU, .threads = 1};
    if (kb_backend_new(&be, &o)) return NULL;
    return be;
}

enum { B = 2, T = 12 };
static int tokens_of(const ep_case *k, int r) { return B * (T + (k->uneven ? r : 0)); }

static void fill(float *p, size_t n, double std, uint64_t seed) {
    co_rng g;
    co_rng_seed(&g, seed);
    for (size_t i = 0; i < n; i++) p[i] = (float)(std * co_rng_normal(&g));
}

/* worst relative difference, |a-b| / max(1, |b|) */
static double rel(const float *a, const float *b, size_t n) {
    double w = 0;
    for (size_t i = 0; i < n; i++) {
        double d = fabs((double)a[i] - b[i]) / fmax(1.0, fabs((double)b[i]));
        if (!(d <= w)) w = isnan(d) ? INFINITY : d;
    }
    return w;
}

typedef struct ref {
    float *y, *dx, *dparams;
    double aux, z;
    int dropped;
    int32_t tpe[64];
} ref;

/* the ep-1 layer on rank s's tokens */
static void reference(const ep_case *k, kb_backend *be, const float *full, const float *bias, int s, ref *out) {
    moe_config c = k->c;
    c.ep_size = 0;
    moe_offsets off;
    REQUIRE(moe_layout(&c, &off) == 0);
    int N = tokens_of(k, s), h = c.hidden;
    moe_layer *m = NULL;
    REQUIRE(moe_new(&m, &c, be, N) == 0);
    float *x = malloc(sizeof(float) * N * h), *dy = malloc(sizeof(float) * N * h);
    fill(x, (size_t)N * h, 1.0, 1000 + (uint64_t)s);
    fill(dy, (size_t)N * h, 0.1, 2000 + (uint64_t)s);
    out->y = malloc(sizeof(float) * N * h);
    out->dx = malloc(sizeof(float) * N * h);
    out->dparams = calloc(off.total, sizeof(float));
    REQUIRE(moe_forward(m, out->y, x, full, bias, B, N / B) == 0);
    REQUIRE(moe_backward(m, out->dx, out->dparams, dy, x, full, 1.0f) == 0);
    out->aux = moe_aux_loss(m);
    out->z = moe_z_loss(m);
    out->dropped = moe_dropped(m);
    memcpy(out->tpe, moe_tokens_per_expert(m), sizeof(int32_t) * (size_t)c.num_experts);
    free(x);
    free(dy);
    moe_destroy(&m);
}

/* Member g's flat buffer from the full one: the router, the experts of expert rank g / etp
 * (each its slice g % etp of the intermediate size: those rows of fc1's gate and up halves,
 * those columns of fc2), the shared expert. At etp 1 moe_ep_slice. */
static void slice_of(const ep_case *k, int P, int g, const float *full, float *local) {
    int t = k->etp > 1 ? k->etp : 1;
    if (t == 1) {
        moe_ep_slice(&k->c, P, g, full, local);
        return;
    }
    moe_config cf = k->c, cl = k->c;
    cf.ep_size = cf.etp_size = 0;
    cl.ep_size = P / t;
    cl.etp_size = t;
    moe_offsets of, ol;
    REQUIRE(moe_layout(&cf, &of) == 0 && moe_layout(&cl, &ol) == 0);
    size_t h = (size_t)cf.hidden, F = (size_t)cf.ffn_hidden, Fl = F / (size_t)t, nh = cf.swiglu ? 2 : 1;
    int El = cf.num_experts / (P / t), q = g / t;
    size_t i = (size_t)(g % t);
    memcpy(local, full, sizeof(float) * (size_t)cf.num_experts * h);
    for (int j = 0; j < El; j++) {
        size_t e = (size_t)(q * El + j);
        const float *W1 = full + of.fc1 + e * nh * F * h, *W2 = full + of.fc2 + e * h * F;
        float *w1 = local + ol.fc1 + (size_t)j * nh * Fl * h, *w2 = local + ol.fc2 + (size_t)j * h * Fl;
        for (size_t half = 0; half < nh; half++)
            memcpy(w1 + half * Fl * h, W1 + (half * F + i * Fl) * h, sizeof(float) * Fl * h);
        for (size_t r = 0; r < h; r++) memcpy(w2 + r * Fl, W2 + r * F + i * Fl, sizeof(float) * Fl);
    }
    memcpy(local + ol.shared_fc1, full + of.shared_fc1, sizeof(float) * (of.total - of.shared_fc1));
}

static cm_comm *connect_group(int rank, int n, const char *dir) {
    char eps[8][160];
    const char *ep[8];
    for (int r = 0; r < n; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/ep%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.connect_timeout_ms = 20000;
    zo.linger_ms = 1000;
    zo.chunk_bytes = 4096; /* blocks of several chunks */
    zo.small_bytes = 256;
    cm_comm *c = NULL;
    int rc = cm_zmq_new(&c, rank, n, ep, &zo);
    CHECK_MSG(rc == 0, "rank %d: cm_zmq_new: %s", rank, co_err_detail());
    return c;
}

static void sc_ep(int rank, int P, const char *dir, const void *arg) {
    const ep_case *k = arg;
    kb_backend *be = backend();
    REQUIRE(be);
    moe_config cf = k->c, cl = k->c;
    int t = k->etp > 1 ? k->etp : 1;
    cf.ep_size = 0;
    cl.ep_size = P / t;
    cl.etp_size = t;
    moe_offsets of, ol;
    REQUIRE(moe_layout(&cf, &of) == 0 && moe_layout(&cl, &ol) == 0);
    int E = cf.num_experts, h = cf.hidden, N = tokens_of(k, rank);
    float *full = malloc(sizeof(float) * of.total), *bias = malloc(sizeof(float) * E);
    fill(full, of.total, 0.4, 77);
    fill(bias, (size_t)E, 0.1, 78);
    /* the reference for every rank's tokens; the expert gradients summed in rank order */
    ref mine = {0};
    float *dsum = calloc(of.total, sizeof(float));
    for (int s = 0; s < P; s++) {
        ref r;
        reference(k, be, full, bias, s, &r);
        for (size_t i = 0; i < of.total; i++) dsum[i] += r.dparams[i];
        if (s == rank) {
            mine = r;
        } else {
            free(r.y);
            free(r.dx);
            free(r.dparams);
        }
    }
    float *local = malloc(sizeof(float) * ol.total);
    slice_of(k, P, rank, full, local);
    cm_comm *c = connect_group(rank, P, dir);
    REQUIRE(c);
    moe_layer *m = NULL;
    REQUIRE(moe_new(&m, &cl, be, N) == 0);
    int rc = moe_set_expert_group(m, c, k->d, 30000);
    CHECK_MSG(rc == 0, "%s: moe_set_expert_group: %s", k->name, co_err_detail());
    float *x = malloc(sizeof(float) * N * h), *dy = malloc(sizeof(float) * N * h);
    fill(x, (size_t)N * h, 1.0, 1000 + (uint64_t)rank);
    fill(dy, (size_t)N * h, 0.1, 2000 + (uint64_t)rank);
    float *y[2], *dx[2], *dp[2];
    for (int rep = 0; rep < 2; rep++) {
        y[rep] = malloc(sizeof(float) * N * h);
        dx[rep] = malloc(sizeof(float) * N * h);
        dp[rep] = calloc(ol.total, sizeof(float));
        rc = moe_forward(m, y[rep], x, local, bias, B, N / B);
        CHECK_MSG(rc == 0, "%s rank %d: forward: %s", k->name, rank, co_err_detail());
        rc = moe_backward(m, dx[rep], dp[rep], dy, x, local, 1.0f);
        CHECK_MSG(rc == 0, "%s rank %d: backward: %s", k->name, rank, co_err_detail());
    }
    /* the reference's gradient for this rank's parameters: its own router and shared
     * expert, the group's sum for its experts */
    float *want = malloc(sizeof(float) * ol.total), *mine_local = malloc(sizeof(float) * ol.total);
    slice_of(k, P, rank, dsum, want);
    slice_of(k, P, rank, mine.dparams, mine_local);
    size_t nr = (size_t)E * h;
    memcpy(want, mine_local, sizeof(float) * nr); /* router: local */
    memcpy(want + ol.shared_fc1, mine_local + ol.shared_fc1, sizeof(float) * (ol.total - ol.shared_fc1));
    double ey = rel(y[0], mine.y, (size_t)N * h), edx = rel(dx[0], mine.dx, (size_t)N * h);
    double er = rel(dp[0], want, nr), ee = rel(dp[0] + ol.fc1, want + ol.fc1, ol.shared_fc1 - ol.fc1);
    double es = rel(dp[0] + ol.shared_fc1, want + ol.shared_fc1, ol.total - ol.shared_fc1);
    CHECK_MSG(ey <= FP32_TOL && edx <= FP32_TOL && er <= FP32_TOL && ee <= FP32_TOL && es <= FP32_TOL,
              "%s rank %d of %d: y %.3g, dx %.3g, router grad %.3g, experts' grads %.3g, shared %.3g", k->name, rank,
              P, ey, edx, er, ee, es);
    CHECK_MSG(fabs(moe_aux_loss(m) - mine.aux) <= 1e-12 && fabs(moe_z_loss(m) - mine.z) <= 1e-12 &&
                  moe_dropped(m) == mine.dropped &&
                  !memcmp(moe_tokens_per_expert(m), mine.tpe, sizeof(int32_t) * (size_t)E),
              "%s rank %d: losses %g/%g vs %g/%g, drops %d vs %d", k->name, rank, moe_aux_loss(m), moe_z_loss(m),
              mine.aux, mine.z, moe_dropped(m), mine.dropped);
    CHECK_MSG(!memcmp(y[0], y[1], sizeof(float) * N * h) && !memcmp(dx[0], dx[1], sizeof(float) * N * h) &&
                  !memcmp(dp[0], dp[1], sizeof(float) * ol.total),
              "%s rank %d: two runs differ", k->name, rank);
    CHECK_MSG(moe_ep_bytes_sent(m) > 0, "%s rank %d: nothing sent", k->name, rank);
    for (int rep = 0; rep < 2; rep++) {
        free(y[rep]);
        free(dx[rep]);
        free(dp[rep]);
    }
    free(want);
    free(mine_local);
    free(mine.y);
    free(mine.dx);
    free(mine.dparams);
    free(dsum);
    free(x);
    free(dy);
    free(local);
    free(full);
    free(bias);
    moe_destroy(&m);
    cm_destroy(&c);
    kb_backend_destroy(&be);
}

static moe_config base(void) {
    moe_config c = {.hidden = 16, .num_experts = 8, .ffn_hidden = 12, .topk = 2, .score = MOE_SCORE_SOFTMAX,
                    .lb = MOE_LB_AUX, .aux_coeff = 0.01f, .drop = MOE_DROP_PROBS};
    return c;
}

static void run_case(ep_case k) {
    char name[160];
    int t = k.etp > 1 ? k.etp : 1;
    snprintf(name, sizeof name, "%s ep %d etp %d %s", k.name, k.P / t, t,
             k.d == MOE_DISPATCH_ALLGATHER ? "allgather" : "alltoall");
    int bad = t_fork_ranks(name, "moeep", k.P, sc_ep, &k, -1, 60000);
    CHECK_MSG(bad == 0, "%s: %d rank(s) failed", name, bad);
}

static void test_softmax_top2(void) {
    for (int d = 0; d < 2; d++)
        for (int P = 2; P <= 4; P += 2) run_case((ep_case){"softmax top-2, aux loss", base(), P, (moe_dispatcher)d, false, 1});
}

static void test_sigmoid_bias_shared_swiglu(void) {
    moe_config c = base();
    c.score = MOE_SCORE_SIGMOID;
    c.topk = 3;
    c.expert_bias = true;
    c.lb = MOE_LB_SEQ_AUX;
    c.z_coeff = 0.001f;
    c.shared_ffn = 10;
    c.swiglu = true;
    c.grouped_gemm = true;
    for (int d = 0; d < 2; d++) run_case((ep_case){"sigmoid top-3, bias, shared, swiglu, grouped", c, 4, (moe_dispatcher)d, false, 1});
}

static void test_capacity(void) {
    moe_config c = base();
    c.capacity_factor = 0.5; /* drops */
    for (int d = 0; d < 2; d++) run_case((ep_case){"capacity 0.5", c, 2, (moe_dispatcher)d, false, 1});
    c.pad_to_capacity = true;
    c.drop = MOE_DROP_POSITION;
    run_case((ep_case){"padded to capacity", c, 4, MOE_DISPATCH_ALLTOALL, false, 1});
}

/* An expert capacity under a token group (tensor ranks' sequence-parallel shards, context
 * ranks' chunks: moe_set_token_group): Megatron's capacity counts each rank's own tokens
 * (apply_router_token_dropping over the rank's routing map), so each rank must find the
 * one-rank layer on its tokens alone (itself checked against numpy, tests/data/moe_ref.py):
 * its output, input and parameter gradients and its drops (without the aux loss, whose
 * counts the group sums). */
static void sc_tokens(int rank, int P, const char *dir, const void *arg) {
    const ep_case *k = arg;
    kb_backend *be = backend();
    REQUIRE(be);
    moe_offsets of;
    REQUIRE(moe_layout(&k->c, &of) == 0);
    int E = k->c.num_experts, h = k->c.hidden, N = tokens_of(k, rank);
    float *full = malloc(sizeof(float) * of.total), *bias = malloc(sizeof(float) * E);
    fill(full, of.total, 0.4, 77);
    fill(bias, (size_t)E, 0.1, 78);
    ref mine;
    reference(k, be, full, bias, rank, &mine);
    CHECK_MSG(mine.dropped > 0, "%s rank %d: the capacity dropped nothing", k->name, rank);
    cm_comm *c = connect_group(rank, P, dir);
    REQUIRE(c);
    moe_layer *m = NULL;
    REQUIRE(moe_new(&m, &k->c, be, N) == 0);
    int rc = moe_set_token_group(m, c, P, 30000);
    CHECK_MSG(rc == 0, "%s: moe_set_token_group: %s", k->name, co_err_detail());
    float *x = malloc(sizeof(float) * N * h), *dy = malloc(sizeof(float) * N * h);
    float *y = malloc(sizeof(float) * N * h), *dx = malloc(sizeof(float) * N * h);
    float *dp = calloc(of.total, sizeof(float));
    fill(x, (size_t)N * h, 1.0, 1000 + (uint64_t)rank);
    fill(dy, (size_t)N * h, 0.1, 2000 + (uint64_t)rank);
    rc = moe_forward(m, y, x, full, bias, B, P * (N / B)); /* (the whole batch's shape: N rows here) */
    CHECK_MSG(rc == 0, "%s rank %d: forward: %s", k->name, rank, co_err_detail());
    rc = moe_backward(m, dx, dp, dy, x, full, 1.0f);
    CHECK_MSG(rc == 0, "%s rank %d: backward: %s", k->name, rank, co_err_detail());
    CHECK_MSG(moe_capacity(m) > 0 && moe_dropped(m) == mine.dropped,
              "%s rank %d: capacity %d, drops %d vs %d", k->name, rank, moe_capacity(m), moe_dropped(m), mine.dropped);
    double ey = rel(y, mine.y, (size_t)N * h), edx = rel(dx, mine.dx, (size_t)N * h), ep = rel(dp, mine.dparams, of.total);
    CHECK_MSG(ey == 0 && edx == 0 && ep == 0, "%s rank %d of %d: y %.3g, dx %.3g, grads %.3g", k->name, rank, P, ey,
              edx, ep);
    free(y), free(dx), free(dp), free(x), free(dy), free(full), free(bias);
    free(mine.y), free(mine.dx), free(mine.dparams);
    moe_destroy(&m);
    cm_destroy(&c);
    kb_backend_destroy(&be);
}

static void test_capacity_token_group(void) {
    moe_config c = base();
    c.capacity_factor = 0.5; /* drops */
    c.lb = MOE_LB_NONE;
    c.aux_coeff = 0;
    c.shared_ffn = 6;
    for (int P = 2; P <= 4; P += 2) {
        ep_case k = {"capacity 0.5 over a token group", c, P, MOE_DISPATCH_ALLTOALL, false, 1};
        int bad = t_fork_ranks(k.name, "moetok", P, sc_tokens, &k, -1, 60000);
        CHECK_MSG(bad == 0, "%s, %d ranks: %d rank(s) failed", k.name, P, bad);
    }
}

/* Megatron's global_aux_loss restated (router.py _apply_global_aux_loss): for each of a
 * step's micro batches, every rank's top-k counts of the softmax scores summed over the
 * data-parallel ranks, added to the running sum, averaged over the micro batches so far; rank
 * r's loss coeff * E / (k T^2) * sum_e (its scores of e summed) * mean count of e, T = its
 * tokens x ranks. x[mb][r] are the micro batches' tokens of every rank. */
static double global_aux_restated(const moe_config *c, const float *Wr, float *const *x, int nmb, int P, int N,
                                  int rank) {
    int E = c->num_experts, h = c->hidden, k = c->topk;
    double sum[64] = {0}, loss = 0, ps[64];
    for (int mb = 0; mb < nmb; mb++) {
        for (int e = 0; e < E; e++) ps[e] = 0;
        for (int r = 0; r < P; r++)
            for (int n = 0; n < N; n++) {
                double a[64], mx = -INFINITY, z = 0;
                for (int e = 0; e < E; e++) {
                    a[e] = 0;
                    for (int j = 0; j < h; j++) a[e] += (double)x[mb * P + r][(size_t)n * h + j] * Wr[(size_t)e * h + j];
                    mx = fmax(mx, a[e]);
                }
                for (int e = 0; e < E; e++) z += (a[e] = exp(a[e] - mx));
                for (int e = 0; e < E; e++) a[e] /= z;
                for (int j = 0; j < k; j++) { /* the top-k (larger first, lower index on ties) */
                    int best = -1;
                    for (int e = 0; e < E; e++)
                        if (a[e] >= 0 && (best < 0 || a[e] > a[best])) best = e;
                    sum[best] += 1;         /* (every rank's counts) */
                    a[best] = -1 - a[best]; /* taken; restored below */
                }
                for (int e = 0; e < E; e++) {
                    if (a[e] < -0.5) a[e] = -1 - a[e];
                    if (r == rank) ps[e] += a[e];
                }
            }
        loss = 0;
        for (int e = 0; e < E; e++) loss += ps[e] * sum[e] / (mb + 1);
    }
    double T = (double)N * P;
    return c->aux_coeff * loss * E / ((double)k * T * T);
}

/* global_aux_loss over a data-parallel group of P forked ranks, three micro batches: each
 * forward's aux loss is the restatement's (the running mean of the global counts), the
 * running sum shared by two layers (micro batch slots), cleared by moe_global_aux_reset. */
static void sc_global(int rank, int P, const char *dir, const void *arg) {
    const ep_case *k = arg;
    kb_backend *be = backend();
    REQUIRE(be);
    moe_offsets of;
    REQUIRE(moe_layout(&k->c, &of) == 0);
    int h = k->c.hidden, N = B * T, nmb = 3;
    float *full = malloc(sizeof(float) * of.total), *bias = malloc(sizeof(float) * k->c.num_experts);
    fill(full, of.total, 0.4, 77);
    fill(bias, (size_t)k->c.num_experts, 0.1, 78);
    float *x[3 * 4];
    for (int i = 0; i < nmb * P; i++) {
        x[i] = malloc(sizeof(float) * N * h);
        fill(x[i], (size_t)N * h, 1.0, 500 + (uint64_t)i);
    }
    cm_comm *c = connect_group(rank, P, dir);
    REQUIRE(c);
    moe_layer *m[2] = {NULL, NULL};
    REQUIRE(moe_new(&m[0], &k->c, be, N) == 0 && moe_new(&m[1], &k->c, be, N) == 0);
    CHECK(moe_set_global_group(m[0], c, NULL, 30000) == 0 && moe_set_global_group(m[1], c, m[0], 30000) == 0);
    float *y = malloc(sizeof(float) * N * h), *dx = malloc(sizeof(float) * N * h), *dp = calloc(of.total, sizeof(float));
    for (int round = 0; round < 2; round++) {
        moe_global_aux_reset(m[1]); /* (the shared sum: slot 0's) */
        for (int mb = 0; mb < nmb; mb++) {
            moe_layer *l = m[mb % 2];
            int rc = moe_forward(l, y, x[mb * P + rank], full, bias, B, T);
            CHECK_MSG(rc == 0, "rank %d: forward: %s", rank, co_err_detail());
            rc = moe_backward(l, dx, dp, y, x[mb * P + rank], full, 1.0f);
            CHECK_MSG(rc == 0, "rank %d: backward: %s", rank, co_err_detail());
            double want = global_aux_restated(&k->c, full + of.router, x, mb + 1, P, N, rank);
            CHECK_MSG(fabs(moe_aux_loss(l) - want) <= 1e-6 * fabs(want) && want > 0,
                      "rank %d round %d micro batch %d: global aux %.9g, restated %.9g", rank, round, mb,
                      moe_aux_loss(l), want);
        }
    }
    for (int i = 0; i < nmb * P; i++) free(x[i]);
    free(y), free(dx), free(dp), free(full), free(bias);
    moe_destroy(&m[0]);
    moe_destroy(&m[1]);
    cm_destroy(&c);
    kb_backend_destroy(&be);
}

static void test_global_aux_loss(void) {
    moe_config c = base();
    c.lb = MOE_LB_GLOBAL_AUX;
    for (int P = 2; P <= 4; P += 2) {
        ep_case k = {"global aux loss", c, P, MOE_DISPATCH_ALLTOALL, false, 1};
        int bad = t_fork_ranks(k.name, "moeglb", P, sc_global, &k, -1, 60000);
        CHECK_MSG(bad == 0, "%s, %d ranks: %d rank(s) failed", k.name, P, bad);
    }
}

static void test_uneven_tokens(void) {
    moe_config c = base();
    c.pre_softmax = true;
    c.topk = 1;
    run_case((ep_case){"uneven tokens, pre-softmax top-1", c, 4, MOE_DISPATCH_ALLTOALL, true, 1});
}

/* the experts split over etp 2 ranks: at ep 1 and ep 2 (groups of 2 and 4), both dispatchers,
 * GELU and SwiGLU (both halves sliced) with the grouped products, uneven token counts */
static void test_expert_tensor_parallel(void) {
    for (int d = 0; d < 2; d++) {
        run_case((ep_case){"softmax top-2, aux loss", base(), 2, (moe_dispatcher)d, false, 2});
        run_case((ep_case){"softmax top-2, aux loss", base(), 4, (moe_dispatcher)d, false, 2});
    }
    moe_config c = base();
    c.score = MOE_SCORE_SIGMOID;
    c.topk = 3;
    c.lb = MOE_LB_SEQ_AUX;
    c.z_coeff = 0.001f;
    c.shared_ffn = 10;
    c.swiglu = true;
    c.grouped_gemm = true;
    for (int d = 0; d < 2; d++)
        run_case((ep_case){"sigmoid top-3, shared, swiglu, grouped", c, 4, (moe_dispatcher)d, false, 2});
    run_case((ep_case){"uneven tokens", base(), 4, MOE_DISPATCH_ALLTOALL, true, 2});
}

static void test_refused(void) {
    moe_config c = base();
    c.ep_size = 3; /* 8 experts */
    moe_offsets off;
    CHECK(moe_layout(&c, &off) == CO_EINVAL && strstr(co_err_detail(), "expert-parallel"));
    kb_backend *be = backend();
    REQUIRE(be);
    c.ep_size = 2;
    moe_layer *m = NULL;
    REQUIRE(moe_new(&m, &c, be, 16) == 0);
    /* no group for a layer laid out for two ranks */
    CHECK(moe_set_expert_group(m, NULL, MOE_DISPATCH_ALLTOALL, 1000) == CO_EINVAL);
    moe_destroy(&m);
    /* the experts split over 5 ranks: 12 does not divide; split over 2 and run without the
     * expert-tensor group */
    c.ep_size = 0;
    c.etp_size = 5;
    CHECK(moe_layout(&c, &off) == CO_EINVAL && strstr(co_err_detail(), "expert-tensor"));
    c.etp_size = 2;
    REQUIRE(moe_new(&m, &c, be, 16) == 0);
    CHECK(moe_set_expert_group(m, NULL, MOE_DISPATCH_ALLTOALL, 1000) == CO_EINVAL);
    float *p = calloc(moe_layer_offsets(m)->total, sizeof(float)), *x = calloc(16 * 16, sizeof(float)),
          *y = calloc(16 * 16, sizeof(float));
    REQUIRE(p && x && y);
    CHECK(moe_forward(m, y, x, p, NULL, 2, 8) == CO_EINVAL && strstr(co_err_detail(), "expert-tensor group"));
    free(p);
    free(x);
    free(y);
    moe_destroy(&m);
    kb_backend_destroy(&be);
}

int main(void) {
    RUN(test_refused);
    RUN(test_softmax_top2);
    RUN(test_sigmoid_bias_shared_swiglu);
    RUN(test_capacity);
    RUN(test_capacity_token_group);
    RUN(test_global_aux_loss);
    RUN(test_uneven_tokens);
    RUN(test_expert_tensor_parallel);
    return TEST_EXIT();
}
