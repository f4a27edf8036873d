/* test_gpt_tp.c - tensor and sequence parallelism (model/gpt.h) against one rank.
 *
 * Each case forks tp rank processes joined by a ZeroMQ communicator over ipc. Every rank
 * trains the tp 1 model and its own slice of the tp model on the same global batches, from
 * the same initial weights (the tp model keeps its slice of the global draw), and checks:
 *   - the loss of every micro batch equals one rank's within LOSS_RTOL;
 *   - after the first backward (and gpt_tp_finalize_grads) every gradient, taken as this
 *     rank's slice of the one-rank global gradient, within GRAD_ATOL + GRAD_RTOL |g|;
 *   - after STEPS AdamW steps every parameter within PARAM_ATOL + PARAM_RTOL |p| (epsilon
 *     1e-3: the key biases' true gradient is 0, and Adam with a tiny epsilon would turn
 *     rounding noise there into full-size steps);
 *   - a second tp run from scratch, with the input-gradient sums not overlapped with the
 *     weight gradients, gives bitwise the same losses, gradients and weights.
 * Cases cover tp 2 and 4, with and without sequence parallelism, query groups above, equal
 * to and below tp, tied and untied heads, SwiGLU and GELU, RoPE and learned positions,
 * LayerNorm and RMSNorm, biases, document resets, hidden dropout (same masks as one rank)
 * and odd vocabularies padded to divisible_by x tp. Bad layouts are refused by
 * gpt_tp_check. fp32 throughout: the parallel sums differ from one rank's only in the order
 * of additions. */
#include "comm/zmq_comm.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "tests/test.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define LOSS_RTOL 2e-6
#define GRAD_ATOL 2e-7
#define GRAD_RTOL 2e-4
#define PARAM_ATOL 2e-6
#define PARAM_RTOL 1e-4
#define STEPS 3
#define MB 2 /* micro batches per step */

typedef struct tcase {
    const char *name;
    int tp;
    bool sp;
    int heads, kv;
    bool swiglu, rope, rms, tied, bias, reset;
    int vocab;
    float hidden_dropout;
} tcase;

static const tcase cases[] = {
    {"tp2 mha gelu learned untied", 2, false, 4, 4, false, false, false, false, true, false, 50, 0},
    {"tp2 sp mha gelu learned untied", 2, true, 4, 4, false, false, false, false, true, false, 50, 0},
    {"tp2 sp gqa(2>=tp) swiglu rope reset dropout", 2, true, 4, 2, true, true, false, false, true, true, 50, 0.1f},
    {"tp2 sp gqa(1<tp) gelu tied dropout", 2, true, 4, 1, false, false, false, true, true, false, 37, 0.1f},
    {"tp4 gqa(2<tp) rms swiglu rope tied", 4, false, 4, 2, true, true, true, true, false, false, 50, 0},
    {"tp4 sp gqa(2<tp) rms swiglu rope tied", 4, true, 4, 2, true, true, true, true, false, false, 50, 0},
    {"tp4 mha gelu learned tied reset dropout", 4, false, 4, 4, false, false, false, true, true, true, 37, 0.1f},
    {"tp4 sp gqa(1<tp) swiglu learned untied odd vocab", 4, true, 8, 1, true, false, false, false, true, false, 37, 0},
};

static gpt_config config(const tcase *k, int tp, int rank) {
    gpt_config c = {.num_layers = 2, .hidden = 32, .heads = k->heads, .kv_groups = k->kv, .head_dim = 8,
                    .ffn_hidden = 64, .vocab = k->vocab, .max_positions = 16, .rope = k->rope,
                    .rotary_base = 10000.0f, .rmsnorm = k->rms, .norm_eps = 1e-5f, .swiglu = k->swiglu,
                    .tied = k->tied, .bias = k->bias, .init_std = 0.2f, .hidden_dropout = k->hidden_dropout,
                    .tp = tp, .tp_rank = rank, .sequence_parallel = tp > 1 && k->sp};
    /* the vocabulary padded as Megatron pads it for the case's tp, at tp 1 too (the same model) */
    c.padded_vocab = gpt_padded_vocab(k->vocab, 2 * k->tp);
    return c;
}

enum { B = 2, T = 8, N = B * T };

typedef struct batch {
    int32_t tok[N], tgt[N], pos[N], seg[N];
    float mask[N], dscale[N];
    gpt_batch b;
} batch;

static void make_batch(batch *bb, const tcase *k, int step, int mb) {
    co_rng r;
    co_rng_seed(&r, 1000u + (uint64_t)step * 17u + (uint64_t)mb);
    for (int i = 0; i < N; i++) {
        bb->tok[i] = (int32_t)(co_rng_next(&r) % (uint64_t)k->vocab);
        bb->tgt[i] = (int32_t)(co_rng_next(&r) % (uint64_t)k->vocab);
        int t = i % T;
        bb->seg[i] = k->reset && t >= 3 ? 3 : 0;
        bb->pos[i] = k->reset ? t - bb->seg[i] : t;
        bb->mask[i] = i % 7 == 2 ? 0.0f : 1.0f;
    }
    double ntok = 0;
    for (int i = 0; i < N; i++) ntok += bb->mask[i];
    for (int i = 0; i < N; i++) bb->dscale[i] = bb->mask[i] / (float)(ntok * MB);
    bb->b = (gpt_batch){.B = B, .T = T, .tokens = bb->tok, .targets = bb->tgt, .positions = bb->pos,
                        .seg = k->reset ? bb->seg : NULL, .loss_mask = bb->mask};
}

/* What one run records: the losses of every micro batch, the gradients after step 0, the
 * weights after the last step. */
typedef struct run_out {
    double loss[STEPS][MB];
    float *grad0, *params;
    size_t n;
} run_out;

static int train(const tcase *k, int tp, int rank, cm_comm *comm, bool overlap, run_out *out) {
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    int rc = kb_backend_new(&be, &bo);
    if (rc) return rc;
    gpt_config c = config(k, tp, rank);
    gpt_model *m = NULL;
    if ((rc = gpt_new(&m, &c, be, B, T))) {
        fprintf(stderr, "gpt_new: %s\n", co_err_detail());
        kb_backend_destroy(&be);
        return rc;
    }
    if (tp > 1) gpt_set_tensor_group(m, comm, 20000);
    gpt_tp_set_overlap(m, overlap);
    gpt_init(m, 42);
    size_t n = gpt_num_params(m);
    float *mom = calloc(n, sizeof(float)), *var = calloc(n, sizeof(float));
    out->n = n;
    out->grad0 = malloc(n * sizeof(float));
    out->params = malloc(n * sizeof(float));
    for (int s = 0; s < STEPS && !rc; s++) {
        gpt_zero_grad(m);
        for (int mb = 0; mb < MB; mb++) {
            batch bb;
            make_batch(&bb, k, s, mb);
            uint64_t dseed = 7777u + (uint64_t)s * 31u + (uint64_t)mb;
            out->loss[s][mb] = gpt_forward(m, &bb.b, true, dseed, bb.dscale, NULL);
            gpt_backward(m, &bb.b, dseed);
        }
        if (tp > 1) gpt_tp_finalize_grads(m);
        if ((rc = kb_backend_status(be))) {
            fprintf(stderr, "step %d: %s: %s\n", s, co_err_name(rc), co_err_detail());
            break;
        }
        if (s == 0) memcpy(out->grad0, gpt_grads(m), n * sizeof(float));
        be->ops->adamw(be, gpt_params(m), gpt_grads(m), mom, var, n, 1e-2f, 0.9f, 0.95f, 1e-3f, 0.1f, 1.0f, s + 1);
    }
    memcpy(out->params, gpt_params(m), n * sizeof(float));
    free(mom);
    free(var);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
    return rc;
}

/* got[i] against want[i] (this rank's slice of the one-rank tensor) within atol + rtol
 * |want|: the worst error as a fraction of the tolerance; the first few misses said. */
static double compare(const tcase *k, int rank, const gpt_tensor *t, const char *what, const float *got,
                      const float *want, double atol, double rtol, int *bad) {
    double worst = 0;
    for (size_t j = 0; j < t->numel; j++) {
        double e = fabs((double)got[j] - want[j]) / (atol + rtol * fabs(want[j]));
        worst = fmax(worst, e);
        if (e > 1 && (*bad)++ < 5)
            CHECK_MSG(0, "%s rank %d: %s of %s[%zu]: %.9g vs one rank's %.9g", k->name, rank, what, t->name, j,
                      got[j], want[j]);
    }
    return worst;
}

/* One rank of a case: the tp 1 reference, the tp run twice, the comparisons. */
static void rank_main(const tcase *k, int rank, const char *dir) {
    char eps[8][300];
    const char *ep[8];
    for (int r = 0; r < k->tp; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.connect_timeout_ms = 20000;
    zo.linger_ms = 1000;
    cm_comm *comm = NULL;
    int rc = cm_zmq_new(&comm, rank, k->tp, ep, &zo);
    REQUIRE(rc == 0);

    run_out ref = {0}, a = {0}, b = {0};
    REQUIRE(train(k, 1, 0, NULL, true, &ref) == 0);
    REQUIRE(train(k, k->tp, rank, comm, true, &a) == 0);
    REQUIRE(train(k, k->tp, rank, comm, false, &b) == 0); /* the input-gradient sum not overlapped */

    /* the tensor tables of both layouts, to slice the reference */
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(kb_backend_new(&be, &bo) == 0);
    gpt_config c1 = config(k, 1, 0), ct = config(k, k->tp, rank);
    gpt_model *m1 = NULL, *mt = NULL;
    REQUIRE(gpt_new(&m1, &c1, be, B, T) == 0);
    REQUIRE(gpt_new(&mt, &ct, be, B, T) == 0);
    REQUIRE(gpt_num_tensors(m1) == gpt_num_tensors(mt));
    const gpt_tensor *t1 = gpt_tensors(m1), *tt = gpt_tensors(mt);

    double worst_loss = 0, worst_grad = 0, worst_param = 0;
    for (int s = 0; s < STEPS; s++)
        for (int mb = 0; mb < MB; mb++) {
            double x = a.loss[s][mb], y = ref.loss[s][mb];
            double e = fabs(x - y) / fmax(fabs(y), 1e-30);
            worst_loss = fmax(worst_loss, e);
            CHECK_MSG(e <= LOSS_RTOL, "%s rank %d: step %d micro batch %d: loss %.9g vs one rank's %.9g", k->name,
                      rank, s, mb, x, y);
            CHECK_MSG(memcmp(&a.loss[s][mb], &b.loss[s][mb], sizeof(double)) == 0,
                      "%s rank %d: step %d: loss not bitwise reproducible", k->name, rank, s);
        }
    float *want = malloc(sizeof(float) * 65536);
    REQUIRE(want);
    int bad_g = 0, bad_p = 0;
    for (int i = 0; i < gpt_num_tensors(mt); i++) {
        REQUIRE(strcmp(t1[i].name, tt[i].name) == 0);
        CHECK(tt[i].gshape[0] == t1[i].shape[0] && tt[i].gshape[1] == t1[i].shape[1]);
        gpt_tensor_take_slice(&tt[i], ref.grad0 + t1[i].offset, want);
        worst_grad = fmax(worst_grad, compare(k, rank, &tt[i], "gradient", a.grad0 + tt[i].offset, want, GRAD_ATOL,
                                              GRAD_RTOL, &bad_g));
        gpt_tensor_take_slice(&tt[i], ref.params + t1[i].offset, want);
        worst_param = fmax(worst_param, compare(k, rank, &tt[i], "weight after the steps", a.params + tt[i].offset,
                                                want, PARAM_ATOL, PARAM_RTOL, &bad_p));
    }
    CHECK_MSG(bad_g == 0, "%s rank %d: %d gradients differ", k->name, rank, bad_g);
    CHECK_MSG(bad_p == 0, "%s rank %d: %d parameters differ", k->name, rank, bad_p);
    CHECK_MSG(memcmp(a.grad0, b.grad0, a.n * sizeof(float)) == 0, "%s rank %d: gradients not bitwise reproducible",
              k->name, rank);
    CHECK_MSG(memcmp(a.params, b.params, a.n * sizeof(float)) == 0, "%s rank %d: weights not bitwise reproducible",
              k->name, rank);
    if (rank == 0)
        fprintf(stderr, "  %-50s loss: worst relative error %.1e; worst error / tolerance: gradients %.3f, weights %.3f\n",
                k->name, worst_loss, worst_grad, worst_param);
    free(want);
    free(ref.grad0), free(ref.params), free(a.grad0), free(a.params), free(b.grad0), free(b.params);
    gpt_destroy(&m1);
    gpt_destroy(&mt);
    kb_backend_destroy(&be);
    cm_destroy(&comm);
}

static void run_case(const tcase *k) {
    char dir[256];
    REQUIRE(t_scratch_dir(dir, sizeof dir, "gpt-tp") == 0);
    pid_t pid[8];
    fflush(stderr);
    for (int r = 0; r < k->tp; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm(120);
            t__failures = 0;
            rank_main(k, r, dir);
            fflush(stderr);
            _exit(t__failures ? 1 : 0);
        }
    }
    for (int r = 0; r < k->tp; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: rank %d ended with status %#x", k->name, r, st);
    }
    t_remove_dir(dir);
}

static void test_layouts_match_one_rank(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* Bad layouts are refused before anything is allocated, naming what does not divide. */
static void test_bad_layouts(void) {
    tcase k = cases[0];
    gpt_config c = config(&k, 4, 0);
    c.heads = 6;
    c.kv_groups = 6;
    CHECK(gpt_tp_check(&c, 8) == CO_EINVAL && strstr(co_err_detail(), "--num-attention-heads 6"));
    c = config(&k, 2, 0);
    c.heads = 6;
    c.kv_groups = 3;
    CHECK(gpt_tp_check(&c, 8) == CO_EINVAL && strstr(co_err_detail(), "--num-query-groups 3"));
    c = config(&k, 4, 0);
    c.kv_groups = 1;
    CHECK(gpt_tp_check(&c, 8) == 0);
    c.ffn_hidden = 66;
    CHECK(gpt_tp_check(&c, 8) == CO_EINVAL && strstr(co_err_detail(), "--ffn-hidden-size 66"));
    c = config(&k, 4, 0);
    c.padded_vocab = 50;
    CHECK(gpt_tp_check(&c, 8) == CO_EINVAL && strstr(co_err_detail(), "padded vocabulary (50)"));
    c = config(&k, 4, 0);
    c.sequence_parallel = true;
    CHECK(gpt_tp_check(&c, 6) == CO_EINVAL && strstr(co_err_detail(), "--seq-length 6"));
    CHECK(gpt_tp_check(&c, 8) == 0);
    c.tp_rank = 4;
    CHECK(gpt_tp_check(&c, 8) == CO_EINVAL);
    /* the padded vocabulary is a multiple of divisible_by x tp */
    CHECK(gpt_padded_vocab(50257, 128 * 4) == 50688);
    CHECK(gpt_padded_vocab(37, 2 * 4) == 40);
}

/* The vocabulary-parallel cross-entropy kernels, the group's reductions done here, against
 * the full cross-entropy at odd vocabulary sizes (padded as the model pads them), with
 * masked rows and a target outside the vocabulary. */
static void test_vocab_parallel_ce(void) {
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(kb_backend_new(&be, &bo) == 0);
    const kb_ops *o = be->ops;
    int vocabs[] = {37, 101, 50257};
    for (size_t vi = 0; vi < sizeof vocabs / sizeof vocabs[0]; vi++)
        for (int tp = 1; tp <= 4; tp++) {
            int Vt = gpt_padded_vocab(vocabs[vi], 2 * tp), V = Vt / tp, R = 6;
            float *full = malloc(sizeof(float) * (size_t)R * Vt), *part = malloc(sizeof(float) * (size_t)R * Vt);
            float lfull[6], lpart[6], ds[6] = {0.5f, 0.25f, 0.0f, 1.0f, 0.125f, 2.0f}, mx[6], all[4][6], sums[4][12];
            int32_t tgt[6] = {0, (int32_t)vocabs[vi] - 1, 3, (int32_t)(vocabs[vi] / 2), -1, 7 % vocabs[vi]};
            REQUIRE(full && part);
            co_rng r;
            co_rng_seed(&r, (uint64_t)vi * 10u + (uint64_t)tp);
            for (size_t i = 0; i < (size_t)R * Vt; i++) full[i] = (float)(co_rng_normal(&r) * 4.0);
            /* shard k holds columns [k V, (k+1) V) of every row */
            for (int k = 0; k < tp; k++)
                for (int n = 0; n < R; n++)
                    memcpy(part + ((size_t)k * R + n) * V, full + (size_t)n * Vt + (size_t)k * V, sizeof(float) * V);
            o->cross_entropy(be, lfull, full, tgt, ds, R, Vt);
            for (int k = 0; k < tp; k++) o->ce_max(be, all[k], part + (size_t)k * R * V, R, V);
            for (int n = 0; n < R; n++) {
                mx[n] = all[0][n];
                for (int k = 1; k < tp; k++) mx[n] = all[k][n] > mx[n] ? all[k][n] : mx[n];
            }
            float red[12] = {0};
            for (int k = 0; k < tp; k++) {
                o->ce_sums(be, sums[k], part + (size_t)k * R * V, mx, tgt, k * V, R, V);
                for (int i = 0; i < 2 * R; i++) red[i] += sums[k][i];
            }
            for (int k = 0; k < tp; k++)
                o->ce_grad(be, lpart, part + (size_t)k * R * V, mx, red, tgt, ds, k * V, Vt, R, V);
            for (int n = 0; n < R; n++) {
                CHECK_CLOSE(lpart[n], lfull[n], 1e-6, 1e-6);
                for (int k = 0; k < tp; k++)
                    for (int j = 0; j < V; j++)
                        CHECK_CLOSE(part[((size_t)k * R + n) * V + j], full[(size_t)n * Vt + (size_t)k * V + j], 1e-7,
                                    1e-5);
            }
            CHECK(lpart[4] == 0.0f); /* no target: no loss */
            free(full);
            free(part);
        }
    kb_backend_destroy(&be);
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    RUN(test_bad_layouts);
    RUN(test_layouts_match_one_rank);
    RUN(test_vocab_parallel_ce); /* after the forks: this process runs kernels itself */
    return TEST_EXIT();
}
