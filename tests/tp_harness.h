/* tp_harness.h - the harness the tensor-parallel model tests share: the CPU one
 * (tests/unit/model/test_gpt_tp.c) and the CUDA one (tests/gpu/test_gpu_tp.c). Each test
 * keeps its own cases, sizes, backend and tolerances; this holds what runs them.
 *
 * A case forks tp rank processes joined by a ZeroMQ tensor group over ipc (tph_run_case).
 * Every rank (tph_rank_main) trains, on the same global batches and from the same initial
 * weights (the tp model keeps its slice of the global draw):
 *   refs: the tp 1 model, once per reference (tph_setup.refs: a backend and tolerances each),
 *   a:    its slice of the tp model on tph_setup.device,
 *   b:    the same again, the input-gradient sums not overlapped with the weight gradients,
 * TPH_STEPS AdamW steps of TPH_MB micro batches (AdamW's epsilon 1e-3: the key biases' true
 * gradient is 0, and a tiny epsilon would turn rounding noise there into full-size steps),
 * and checks a against every reference (this rank's slice of every one-rank tensor,
 * gpt_tensor_take_slice):
 *   - the loss of every micro batch within loss_rtol (and each MTP depth's, tph_sizes.mtp);
 *   - every gradient after the first backward (and gpt_tp_finalize_grads) within
 *     grad_atol + grad_atol_rel max|g| + grad_rtol |g| (max|g|: the largest of the one-rank
 *     tensor);
 *   - every parameter after the steps within param_atol + param_rtol |p|;
 * and b bitwise equal to a (losses, gradients, weights). A NaN fails every comparison.
 * Then tph_setup.report says the worst errors.
 *
 * Static functions: include it in one test file. */
#ifndef COHORT_TESTS_TP_HARNESS_H
#define COHORT_TESTS_TP_HARNESS_H

#include "comm/zmq_comm.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "tests/test.h"

#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#define TPH_STEPS 3
#define TPH_MB 2     /* micro batches per step */
#define TPH_MAX_N 64 /* tokens in a micro batch (B x T) */
#define TPH_MAX_TP 8
#define TPH_MAX_REFS 2

/* A model layout. The vocabulary is padded as Megatron pads it for the case's tp (at tp 1
 * too: the same model). */
typedef struct tph_case {
    const char *name;
    int tp;
    bool sp;
    int heads, kv;
    bool swiglu, rope, rms, tied, bias, reset;
    int vocab;
    float hidden_dropout;
} tph_case;

/* The sizes a test uses for every case. */
typedef struct tph_sizes {
    int hidden, head_dim, ffn_hidden, max_positions;
    int B, T;     /* a micro batch */
    int reset_at; /* cases with document resets: the second document starts at this position */
    /* MoE layers (tensor parallelism needs sequence parallelism and no biases for them):
     * 0: none; 1: every layer, 4 experts, softmax top-2, aux_loss, z-loss, a shared expert;
     * 2: layer 0 of 2, 4 experts in 2 groups, sigmoid top-2 scaled, seq_aux_loss, z-loss,
     * the expert bias, grouped products */
    int moe;
    /* with moe at tp > 1: 0 the experts whole on every tensor rank (expert tensor-parallel
     * size 1); 1 or 2 split over the tensor group (size tp), the tokens exchanged by the
     * alltoall (1) or allgather (2) dispatcher over it */
    int etp;
    /* multi-token prediction depths (0: none; loss scaling 0.3) */
    int mtp;
} tph_sizes;

/* A one-rank run to compare the tp run with. */
typedef struct tph_ref {
    kb_device device;
    const char *whose; /* in messages: "vs one rank's" */
    double loss_rtol, grad_atol, grad_atol_rel, grad_rtol, param_atol, param_rtol;
} tph_ref;

/* The worst errors against one reference: the loss's relative error, the gradients' and
 * weights' as a fraction of the tolerance. */
typedef struct tph_worst {
    double loss, grad, param;
} tph_worst;

typedef struct tph_setup {
    tph_sizes sizes;
    kb_device device;     /* the tp runs */
    int timeout_ms;       /* connecting the group, and its collectives */
    unsigned alarm_s;     /* a rank process's limit */
    const char *scratch;  /* prefix of the directory of the ipc endpoints */
    int nrefs;
    tph_ref refs[TPH_MAX_REFS];
    void (*report)(const tph_case *k, int rank, const tph_worst *w); /* w[nrefs] */
} tph_setup;

static gpt_config tph_config(const tph_sizes *s, const tph_case *k, int tp, int rank) {
    gpt_config c = {.num_layers = 2, .hidden = s->hidden, .heads = k->heads, .kv_groups = k->kv,
                    .head_dim = s->head_dim, .ffn_hidden = s->ffn_hidden, .vocab = k->vocab,
                    .max_positions = s->max_positions, .rope = k->rope, .rotary_base = 10000.0f,
                    .rmsnorm = k->rms, .norm_eps = 1e-5f, .swiglu = k->swiglu, .tied = k->tied, .bias = k->bias,
                    .init_std = 0.2f, .hidden_dropout = k->hidden_dropout, .tp = tp, .tp_rank = rank,
                    .sequence_parallel = tp > 1 && k->sp};
    c.padded_vocab = gpt_padded_vocab(k->vocab, 2 * k->tp);
    c.mtp_layers = s->mtp;
    c.mtp_loss_scaling = 0.3f;
    if (s->moe) {
        moe_config *mc = &c.moe;
        *mc = (moe_config){.num_experts = 4, .ffn_hidden = s->ffn_hidden / 2, .topk = 2, .lb = MOE_LB_AUX,
                           .aux_coeff = 0.1f, .z_coeff = 0.01f};
        c.moe_layer_freq = 1;
        if (s->moe == 1) mc->shared_ffn = s->ffn_hidden / 4;
        if (s->moe == 2) {
            mc->score = MOE_SCORE_SIGMOID;
            mc->num_groups = 2;
            mc->group_topk = 1;
            mc->scaling_factor = 2.5f;
            mc->lb = MOE_LB_SEQ_AUX;
            mc->expert_bias = true;
            mc->grouped_gemm = true;
            c.moe_layer_freq = 2;
        }
        if (s->etp && tp > 1) mc->etp_size = tp;
    }
    return c;
}

typedef struct tph_batch {
    int32_t tok[TPH_MAX_N], tgt[TPH_MAX_N], pos[TPH_MAX_N], seg[TPH_MAX_N];
    float mask[TPH_MAX_N], dscale[TPH_MAX_N];
    gpt_batch b;
} tph_batch;

/* Micro batch mb of step `step` (s->B x s->T <= TPH_MAX_N, checked by tph_train). */
static void tph_make_batch(tph_batch *bb, const tph_sizes *s, const tph_case *k, int step, int mb) {
    const int N = s->B * s->T;
    co_rng r;
    co_rng_seed(&r, 1000u + (uint64_t)step * 17u + (uint64_t)mb);
    for (int i = 0; i < N; i++) {
        bb->tok[i] = (int32_t)(co_rng_next(&r) % (uint64_t)k->vocab);
        bb->tgt[i] = (int32_t)(co_rng_next(&r) % (uint64_t)k->vocab);
        int t = i % s->T;
        bb->seg[i] = k->reset && t >= s->reset_at ? s->reset_at : 0;
        bb->pos[i] = k->reset ? t - bb->seg[i] : t;
        bb->mask[i] = i % 7 == 2 ? 0.0f : 1.0f;
    }
    double ntok = 0;
    for (int i = 0; i < N; i++) ntok += bb->mask[i];
    for (int i = 0; i < N; i++) bb->dscale[i] = bb->mask[i] / (float)(ntok * TPH_MB);
    bb->b = (gpt_batch){.B = s->B, .T = s->T, .tokens = bb->tok, .targets = bb->tgt, .positions = bb->pos,
                        .seg = k->reset ? bb->seg : NULL, .loss_mask = bb->mask};
}

/* What one run records (host copies): the losses of every micro batch, the gradients after
 * step 0, the weights after the last step. */
typedef struct tph_run_out {
    double loss[TPH_STEPS][TPH_MB];
    double mtp_loss[TPH_STEPS][TPH_MB][GPT_MAX_MTP]; /* each MTP depth's */
    float *grad0, *params;
    size_t n;
} tph_run_out;

static void tph_run_free(tph_run_out *o) {
    free(o->grad0);
    free(o->params);
    o->grad0 = o->params = NULL;
}

/* One run: the model at tp (this rank's slice; the group comm when tp > 1) on a backend of
 * device dev; 0 or an error code, said on stderr. */
static int tph_train(const tph_setup *h, const tph_case *k, kb_device dev, int tp, int rank, cm_comm *comm,
                     bool overlap, tph_run_out *out) {
    const tph_sizes *s = &h->sizes;
    if (s->B * s->T > TPH_MAX_N) {
        fprintf(stderr, "rank %d: a micro batch of %d x %d tokens: more than TPH_MAX_N\n", rank, s->B, s->T);
        return CO_EINVAL;
    }
    kb_backend *be = NULL;
    kb_options bo = {.device = dev, .threads = 1, .cuda_device = 0};
    int rc = kb_backend_new(&be, &bo);
    if (rc) {
        fprintf(stderr, "rank %d: %s backend: %s\n", rank, dev == KB_DEVICE_CUDA ? "CUDA" : "CPU", co_err_detail());
        return rc;
    }
    const kb_ops *o = be->ops;
    gpt_config c = tph_config(s, k, tp, rank);
    gpt_model *m = NULL;
    if ((rc = gpt_new(&m, &c, be, s->B, s->T))) {
        fprintf(stderr, "rank %d: gpt_new: %s\n", rank, co_err_detail());
        kb_backend_destroy(&be);
        return rc;
    }
    if (tp > 1) gpt_set_tensor_group(m, comm, h->timeout_ms);
    if (tp > 1 && c.moe.etp_size > 1 &&
        (rc = gpt_set_expert_group(m, comm, s->etp == 2 ? MOE_DISPATCH_ALLGATHER : MOE_DISPATCH_ALLTOALL,
                                   h->timeout_ms))) {
        fprintf(stderr, "rank %d: gpt_set_expert_group: %s\n", rank, co_err_detail());
        gpt_destroy(&m);
        kb_backend_destroy(&be);
        return rc;
    }
    gpt_tp_set_overlap(m, overlap);
    gpt_init(m, 42);
    /* an uneven expert bias (it starts at zero; no gradient moves it) */
    for (int l = 0; l < c.num_layers; l++) {
        float *eb = gpt_moe_expert_bias(m, l);
        for (int e = 0; eb && e < c.moe.num_experts; e++) eb[e] = 0.02f * (float)(e % 3) - 0.02f;
    }
    size_t n = gpt_num_params(m);
    /* the moments in backend memory (zeroed): the CUDA backend's adamw runs on the GPU */
    float *mom = o->alloc(be, n * sizeof(float)), *var = o->alloc(be, n * sizeof(float));
    out->n = n;
    out->grad0 = malloc(n * sizeof(float));
    out->params = malloc(n * sizeof(float));
    if (!mom || !var || !out->grad0 || !out->params) rc = CO_ENOMEM;
    for (int st = 0; st < TPH_STEPS && !rc; st++) {
        gpt_zero_grad(m);
        for (int mb = 0; mb < TPH_MB; mb++) {
            tph_batch bb;
            tph_make_batch(&bb, s, k, st, mb);
            uint64_t dseed = 7777u + (uint64_t)st * 31u + (uint64_t)mb;
            out->loss[st][mb] = gpt_forward(m, &bb.b, true, dseed, bb.dscale, NULL);
            if (c.mtp_layers > 0) gpt_mtp_last_losses(m, out->mtp_loss[st][mb]);
            gpt_backward(m, &bb.b, dseed);
        }
        if (tp > 1) gpt_tp_finalize_grads(m);
        if ((rc = kb_backend_status(be))) {
            fprintf(stderr, "rank %d step %d: %s: %s\n", rank, st, co_err_name(rc), co_err_detail());
            break;
        }
        if (st == 0) o->copy(be, out->grad0, gpt_grads(m), n * sizeof(float)); /* waits for the backend */
        o->adamw(be, gpt_params(m), gpt_grads(m), mom, var, n, 1e-2f, 0.9f, 0.95f, 1e-3f, 0.1f, 1.0f, st + 1);
    }
    if (!rc) o->copy(be, out->params, gpt_params(m), n * sizeof(float));
    if (!rc && (rc = kb_backend_status(be))) fprintf(stderr, "rank %d: %s\n", rank, co_err_detail());
    if (mom) o->free(be, mom);
    if (var) o->free(be, var);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
    return rc;
}

/* got[i] against want[i] (this rank's slice of the one-rank tensor) within atol + rtol
 * |want|: the worst error as a fraction of the tolerance (a NaN: infinity); the first few
 * misses said. */
static double tph_compare(const tph_case *k, int rank, const gpt_tensor *t, const char *what, const char *whose,
                          const float *got, const float *want, double atol, double rtol, int *bad) {
    double worst = 0;
    for (size_t j = 0; j < t->numel; j++) {
        double e = fabs((double)got[j] - want[j]) / (atol + rtol * fabs(want[j]));
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        if (!(e <= 1) && (*bad)++ < 5)
            CHECK_MSG(0, "%s rank %d: %s of %s[%zu]: %.9g vs %s %.9g", k->name, rank, what, t->name, j, got[j],
                      whose, want[j]);
    }
    return worst;
}

static double tph_max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* The tensor tables of both layouts (models on a CPU backend, the tables only), to slice
 * the one-rank tensors; their names and global shapes checked to agree. */
typedef struct tph_tables {
    kb_backend *be;
    gpt_model *m1, *mt;
    const gpt_tensor *t1, *tt;
    int n;
    size_t max_numel; /* of this rank's slices */
} tph_tables;

static void tph_tables_close(tph_tables *tb) {
    gpt_destroy(&tb->m1);
    gpt_destroy(&tb->mt);
    kb_backend_destroy(&tb->be);
}

static bool tph_tables_open(tph_tables *tb, const tph_sizes *s, const tph_case *k, int rank) {
    *tb = (tph_tables){0};
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    if (kb_backend_new(&tb->be, &bo)) return false;
    gpt_config c1 = tph_config(s, k, 1, 0), ct = tph_config(s, k, k->tp, rank);
    if (gpt_new(&tb->m1, &c1, tb->be, s->B, s->T) || gpt_new(&tb->mt, &ct, tb->be, s->B, s->T) ||
        gpt_num_tensors(tb->m1) != gpt_num_tensors(tb->mt)) {
        CHECK_MSG(0, "%s rank %d: the tensor tables: %s", k->name, rank, co_err_detail());
        tph_tables_close(tb);
        return false;
    }
    tb->t1 = gpt_tensors(tb->m1);
    tb->tt = gpt_tensors(tb->mt);
    tb->n = gpt_num_tensors(tb->mt);
    for (int i = 0; i < tb->n; i++) {
        const gpt_tensor *t = &tb->tt[i];
        if (strcmp(tb->t1[i].name, t->name) != 0) {
            CHECK_MSG(0, "%s rank %d: tensor %d: %s vs one rank's %s", k->name, rank, i, t->name, tb->t1[i].name);
            tph_tables_close(tb);
            return false;
        }
        CHECK(t->gshape[0] == tb->t1[i].shape[0] && t->gshape[1] == tb->t1[i].shape[1]);
        tb->max_numel = t->numel > tb->max_numel ? t->numel : tb->max_numel;
    }
    return true;
}

/* a against one reference: losses, then every tensor's gradients and weights. */
static void tph_check_ref(const tph_ref *rf, const tph_case *k, int rank, const tph_tables *tb, const tph_run_out *a,
                          const tph_run_out *ref, float *want, tph_worst *w) {
    *w = (tph_worst){0};
    for (int s = 0; s < TPH_STEPS; s++)
        for (int mb = 0; mb < TPH_MB; mb++) {
            double x = a->loss[s][mb], y = ref->loss[s][mb];
            double e = fabs(x - y) / fmax(fabs(y), 1e-30);
            w->loss = fmax(w->loss, e);
            CHECK_MSG(e <= rf->loss_rtol, "%s rank %d: step %d micro batch %d: loss %.9g vs %s %.9g", k->name,
                      rank, s, mb, x, rf->whose, y);
            for (int d = 0; d < GPT_MAX_MTP; d++) {
                x = a->mtp_loss[s][mb][d], y = ref->mtp_loss[s][mb][d];
                e = fabs(x - y) / fmax(fabs(y), 1e-30);
                w->loss = fmax(w->loss, e);
                CHECK_MSG(e <= rf->loss_rtol, "%s rank %d: step %d micro batch %d: mtp_%d loss %.9g vs %s %.9g",
                          k->name, rank, s, mb, d + 1, x, rf->whose, y);
            }
        }
    int bad_g = 0, bad_p = 0;
    for (int i = 0; i < tb->n; i++) {
        const gpt_tensor *t = &tb->tt[i], *t1 = &tb->t1[i];
        double gatol = rf->grad_atol;
        if (rf->grad_atol_rel > 0) gatol += rf->grad_atol_rel * tph_max_abs(ref->grad0 + t1->offset, t1->numel);
        gpt_tensor_take_slice(t, ref->grad0 + t1->offset, want);
        w->grad = fmax(w->grad, tph_compare(k, rank, t, "gradient", rf->whose, a->grad0 + t->offset, want, gatol,
                                            rf->grad_rtol, &bad_g));
        gpt_tensor_take_slice(t, ref->params + t1->offset, want);
        w->param = fmax(w->param, tph_compare(k, rank, t, "weight after the steps", rf->whose, a->params + t->offset,
                                              want, rf->param_atol, rf->param_rtol, &bad_p));
    }
    CHECK_MSG(bad_g == 0, "%s rank %d: %d gradients differ from %s", k->name, rank, bad_g, rf->whose);
    CHECK_MSG(bad_p == 0, "%s rank %d: %d parameters differ from %s", k->name, rank, bad_p, rf->whose);
}

/* One rank of a case: the references, the tp run twice, the comparisons. */
static void tph_rank_main(const tph_setup *h, const tph_case *k, int rank, const char *dir) {
    char eps[TPH_MAX_TP][300];
    const char *ep[TPH_MAX_TP];
    for (int r = 0; r < k->tp; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.connect_timeout_ms = h->timeout_ms;
    zo.linger_ms = 1000;
    cm_comm *comm = NULL;
    int rc = cm_zmq_new(&comm, rank, k->tp, ep, &zo);
    REQUIRE(rc == 0);

    tph_run_out ref[TPH_MAX_REFS] = {0}, a = {0}, b = {0};
    for (int i = 0; i < h->nrefs; i++) REQUIRE(tph_train(h, k, h->refs[i].device, 1, 0, NULL, true, &ref[i]) == 0);
    REQUIRE(tph_train(h, k, h->device, k->tp, rank, comm, true, &a) == 0);
    REQUIRE(tph_train(h, k, h->device, k->tp, rank, comm, false, &b) == 0);

    tph_tables tb;
    REQUIRE(tph_tables_open(&tb, &h->sizes, k, rank));
    float *want = malloc(sizeof(float) * (tb.max_numel ? tb.max_numel : 1));
    REQUIRE(want);
    tph_worst w[TPH_MAX_REFS];
    for (int i = 0; i < h->nrefs; i++) tph_check_ref(&h->refs[i], k, rank, &tb, &a, &ref[i], want, &w[i]);
    for (int s = 0; s < TPH_STEPS; s++)
        for (int mb = 0; mb < TPH_MB; mb++)
            CHECK_MSG(memcmp(&a.loss[s][mb], &b.loss[s][mb], sizeof(double)) == 0 &&
                          memcmp(a.mtp_loss[s][mb], b.mtp_loss[s][mb], sizeof a.mtp_loss[s][mb]) == 0,
                      "%s rank %d: step %d: loss not bitwise reproducible", k->name, rank, s);
    CHECK_MSG(memcmp(a.grad0, b.grad0, a.n * sizeof(float)) == 0, "%s rank %d: gradients not bitwise reproducible",
              k->name, rank);
    CHECK_MSG(memcmp(a.params, b.params, a.n * sizeof(float)) == 0, "%s rank %d: weights not bitwise reproducible",
              k->name, rank);
    if (h->report) h->report(k, rank, w);
    free(want);
    for (int i = 0; i < h->nrefs; i++) tph_run_free(&ref[i]);
    tph_run_free(&a);
    tph_run_free(&b);
    tph_tables_close(&tb);
    cm_destroy(&comm);
}

/* Forks the case's tp ranks (each ends with its own verdict) and waits for them. */
static void tph_run_case(const tph_setup *h, const tph_case *k) {
    REQUIRE(k->tp >= 1 && k->tp <= TPH_MAX_TP && h->nrefs >= 1 && h->nrefs <= TPH_MAX_REFS);
    char dir[256];
    REQUIRE(t_scratch_dir(dir, sizeof dir, h->scratch) == 0);
    pid_t pid[TPH_MAX_TP];
    fflush(stderr);
    for (int r = 0; r < k->tp; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm(h->alarm_s);
            t__failures = 0;
            tph_rank_main(h, k, r, dir);
            fflush(stderr);
            _exit(t__failures ? 1 : 0);
        }
        REQUIRE(pid[r] > 0);
    }
    for (int r = 0; r < k->tp; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: rank %d ended with status %#x", k->name, r, st);
    }
    t_remove_dir(dir);
}

#endif
