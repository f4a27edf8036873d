/* test_gpt_tp.c - tensor and sequence parallelism (model/gpt.h) against one rank.
 *
 * Each case forks tp rank processes joined by a ZeroMQ communicator over ipc
 * (tests/tp_harness.h). Every rank trains the tp 1 model and its own slice of the tp model on
 * the same global batches, from the same initial weights (the tp model keeps its slice of
 * the global draw), all on the CPU backend, and checks:
 *   - the loss of every micro batch equals one rank's within LOSS_RTOL;
 *   - after the first backward (and gpt_tp_finalize_grads) every gradient, taken as this
 *     rank's slice of the one-rank global gradient, within GRAD_ATOL + GRAD_RTOL |g|;
 *   - after TPH_STEPS AdamW steps every parameter within PARAM_ATOL + PARAM_RTOL |p| (epsilon
 *     1e-3: the key biases' true gradient is 0, and Adam with a tiny epsilon would turn
 *     rounding noise there into full-size steps);
 *   - a second tp run from scratch, with the input-gradient sums not overlapped with the
 *     weight gradients, gives bitwise the same losses, gradients and weights.
 * Cases cover tp 2 and 4, with and without sequence parallelism, query groups above, equal
 * to and below tp, tied and untied heads, SwiGLU and GELU, RoPE and learned positions,
 * LayerNorm and RMSNorm, biases, document resets, hidden dropout (same masks as one rank)
 * and odd vocabularies padded to divisible_by x tp. MoE models (tp 2 with sequence
 * parallelism: the router, experts and shared expert whole on each rank over its tokens, aux
 * loss or per-sequence aux loss, z-loss, shared expert or expert bias, 3 sequences so that a
 * rank holds one and a half) against one rank the same way, the same with the experts split
 * over the tensor group (expert tensor-parallel size 2; alltoall and allgather), and MoE
 * without sequence parallelism refused. Multi-token prediction (2 depths, docs/mtp.md) at tp 2 with and
 * without sequence parallelism and at tp 4 with it: the main loss and each depth's, every
 * gradient and weight; a hidden size eh_proj cannot split refused.
 * Bad layouts are refused by gpt_tp_check. fp32 throughout: the parallel sums differ from
 * one rank's only in the order of additions. */
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "tests/test.h"
#include "tests/tp_harness.h"

#include <signal.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#define LOSS_RTOL 2e-6
#define GRAD_ATOL 2e-7
#define GRAD_RTOL 2e-4
#define PARAM_ATOL 2e-6
#define PARAM_RTOL 1e-4

static const tph_case cases[] = {
    {"tp2 mha gelu learned untied", 2, false, 4, 4, false, false, false, false, true, false, 50, 0},
    {"tp2 sp mha gelu learned untied", 2, true, 4, 4, false, false, false, false, true, false, 50, 0},
    {"tp2 sp gqa(2>=tp) swiglu rope reset dropout", 2, true, 4, 2, true, true, false, false, true, true, 50, 0.1f},
    {"tp2 sp gqa(1<tp) gelu tied dropout", 2, true, 4, 1, false, false, false, true, true, false, 37, 0.1f},
    {"tp4 gqa(2<tp) rms swiglu rope tied", 4, false, 4, 2, true, true, true, true, false, false, 50, 0},
    {"tp4 sp gqa(2<tp) rms swiglu rope tied", 4, true, 4, 2, true, true, true, true, false, false, 50, 0},
    {"tp4 mha gelu learned tied reset dropout", 4, false, 4, 4, false, false, false, true, true, true, 37, 0.1f},
    {"tp4 sp gqa(1<tp) swiglu learned untied odd vocab", 4, true, 8, 1, true, false, false, false, true, false, 37, 0},
};

static void report(const tph_case *k, int rank, const tph_worst *w) {
    if (rank == 0)
        fprintf(stderr, "  %-50s loss: worst relative error %.1e; worst error / tolerance: gradients %.3f, weights %.3f\n",
                k->name, w[0].loss, w[0].grad, w[0].param);
}

static const tph_setup setup = {
    .sizes = {.hidden = 32, .head_dim = 8, .ffn_hidden = 64, .max_positions = 16, .B = 2, .T = 8, .reset_at = 3},
    .device = KB_DEVICE_CPU,
    .timeout_ms = 20000,
    .alarm_s = 120,
    .scratch = "gpt-tp",
    .nrefs = 1,
    .refs = {{.device = KB_DEVICE_CPU, .whose = "one rank's", .loss_rtol = LOSS_RTOL, .grad_atol = GRAD_ATOL,
              .grad_rtol = GRAD_RTOL, .param_atol = PARAM_ATOL, .param_rtol = PARAM_RTOL}},
    .report = report,
};

/* the model of a case at tp (this test's sizes; the vocabulary padded for the case's tp) */
static gpt_config config(const tph_case *k, int tp, int rank) { return tph_config(&setup.sizes, k, tp, rank); }

static void test_layouts_match_one_rank(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) tph_run_case(&setup, &cases[i]);
}

/* MoE at tp 2 with sequence parallelism (Megatron's expert tensor-parallel size 1): the
 * aux and z losses enter every gradient; 3 sequences of 8 split into 12 tokens per rank (the
 * per-sequence aux loss's counts span both ranks). */
static const tph_case moe_cases[] = {
    {"tp2 sp moe softmax aux z shared, gelu", 2, true, 4, 4, false, false, false, false, false, false, 50, 0},
    {"tp2 sp moe sigmoid groups seq_aux z bias, swiglu", 2, true, 4, 2, true, true, true, true, false, false, 50,
     0.1f},
};

static void test_moe_matches_one_rank(void) {
    for (int v = 1; v <= 2; v++) {
        tph_setup s = setup;
        s.sizes.moe = v;
        s.sizes.B = 3;
        s.scratch = "gpt-tp-moe";
        /* plus 1e-6 of the tensor's largest gradient: with dropout one embedding gradient (of
         * 2.3e-4, the tensor's largest far above) sums terms whose rounding leaves 3.8e-7 */
        s.refs[0].grad_atol_rel = 1e-6;
        tph_run_case(&s, &moe_cases[v - 1]);
    }
}

/* The same MoE models with the experts split over the tensor group (expert tensor-parallel
 * size 2, Megatron's default): each expert's fc1 rows (both SwiGLU halves) and fc2 columns
 * split like the dense MLP's, the routed rows exchanged over the tensor group by the
 * alltoall (model 1) and the allgather (model 2) dispatcher, the slices' gradients whole
 * (not summed by gpt_tp_finalize_grads); every gradient and weight of this rank's slice
 * against one rank's. */
static void test_moe_etp_matches_one_rank(void) {
    static const char *names[2] = {"tp2 sp etp2 alltoall moe softmax aux z shared, gelu",
                                   "tp2 sp etp2 allgather moe sigmoid groups seq_aux z bias, swiglu"};
    for (int v = 1; v <= 2; v++) {
        tph_setup s = setup;
        s.sizes.moe = v;
        s.sizes.etp = v;
        s.sizes.B = 3;
        s.scratch = "gpt-tp-etp";
        s.refs[0].grad_atol_rel = 1e-6; /* as the MoE cases above */
        tph_case k = moe_cases[v - 1];
        k.name = names[v - 1];
        tph_run_case(&s, &k);
    }
}

/* Multi-token prediction, 2 depths (each: the rolled ids through the vocabulary-parallel
 * embedding, enorm/hnorm, eh_proj, a decoder layer split as the decoder's, the final norm,
 * the shared output layer): each depth's loss within LOSS_RTOL of one rank's, every
 * gradient and weight as the dense cases (the MTP depths' tensors included). */
static const tph_case mtp_cases[] = {
    {"tp2 mtp2 gqa(2>=tp) rms swiglu rope tied dropout", 2, false, 4, 2, true, true, true, true, false, false, 50,
     0.1f},
    {"tp2 sp mtp2 mha gelu learned untied bias dropout", 2, true, 4, 4, false, false, false, false, true, false, 37,
     0.1f},
    {"tp2 sp mtp2 gqa(1<tp) rms swiglu rope tied", 2, true, 4, 1, true, true, true, true, false, false, 50, 0},
    {"tp4 sp mtp2 gqa(2<tp) gelu learned untied dropout", 4, true, 4, 2, false, false, false, false, true, false, 37,
     0.1f},
};

static void test_mtp_matches_one_rank(void) {
    for (size_t i = 0; i < sizeof mtp_cases / sizeof mtp_cases[0]; i++) {
        tph_setup s = setup;
        s.sizes.mtp = 2;
        s.scratch = "gpt-tp-mtp";
        /* plus 1e-6 of the tensor's largest gradient (as the MoE cases): the depths' gradients
         * reach the decoder's layers through more sums, and a small entry of a layer's qkv
         * (4.6e-5, the tensor's largest far above) differs by 1.8e-7 under another build's
         * rounding (the debug ASan build) */
        s.refs[0].grad_atol_rel = 1e-6;
        tph_run_case(&s, &mtp_cases[i]);
    }
    /* eh_proj is column-parallel: the hidden size must divide over the group */
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(kb_backend_new(&be, &bo) == 0);
    tph_sizes sz = setup.sizes;
    sz.mtp = 1;
    gpt_config c = tph_config(&sz, &mtp_cases[3], 4, 0);
    c.hidden = 30;
    gpt_model *m = NULL;
    CHECK(gpt_new(&m, &c, be, 2, 8) == CO_EINVAL && strstr(co_err_detail(), "--hidden-size 30 is not divisible"));
    CHECK(m == NULL);
    kb_backend_destroy(&be);
}

/* MoE with tensor parallelism refused without sequence parallelism (gpt_new, before any
 * memory is allocated); with a capacity it is built (Megatron's capacity over each rank's
 * tokens: test_moe_ep, tests/integration/moe_test.sh capacity_tpcp). */
static void test_moe_refused(void) {
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(kb_backend_new(&be, &bo) == 0);
    tph_sizes sz = setup.sizes;
    sz.moe = 1;
    gpt_config c = tph_config(&sz, &moe_cases[0], 2, 0);
    gpt_model *m = NULL;
    c.sequence_parallel = false;
    CHECK(gpt_new(&m, &c, be, 2, 8) == CO_EUNSUPPORTED && strstr(co_err_detail(), "needs sequence parallelism"));
    c = tph_config(&sz, &moe_cases[0], 2, 0);
    CHECK(m == NULL);
    c.moe.capacity_factor = 1.0;
    CHECK(gpt_new(&m, &c, be, 2, 8) == 0 && m != NULL);
    gpt_destroy(&m);
    /* (expert parallelism combines with it: the expert group spans the tensor ranks,
     * tests/integration/moe_ep_test.sh tp) */
    kb_backend_destroy(&be);
}

/* Bad layouts are refused before anything is allocated, naming what does not divide. */
static void test_bad_layouts(void) {
    tph_case k = cases[0];
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
    RUN(test_moe_refused);
    RUN(test_moe_matches_one_rank);
    RUN(test_moe_etp_matches_one_rank);
    RUN(test_mtp_matches_one_rank);
    RUN(test_vocab_parallel_ce); /* after the forks: this process runs kernels itself */
    return TEST_EXIT();
}
