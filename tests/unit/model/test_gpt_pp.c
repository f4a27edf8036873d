/* test_gpt_pp.c - pipeline chunks (model/gpt.h, "pipeline stages") against the whole model.
 *
 * Every case splits one model into pipeline ranks, each holding one or more chunks of
 * consecutive layers (the first with the embedding, the last with the head), as separate
 * gpt_models in this process; activations and their gradients are handed from chunk to chunk
 * by copies (what the pipeline's send and receive do). They train on the same batches as the
 * whole model, from the same initial weights (every chunk keeps its part of the global
 * draw), and the test checks:
 *   - every micro batch's loss of the first step equals the whole model's bitwise (the same
 *     operations on the same numbers: dropout is keyed by the global layer), and of the later
 *     steps within LOSS_RTOL (the weights then differ by the rounding of the norm's sum);
 *   - after the first step every gradient equals the whole model's bitwise, except the tied
 *     word embedding, whose two copies' gradients (first and last stage) are summed as the
 *     embedding group sums them: equal within fp32 rounding of the other order of additions;
 *   - after STEPS AdamW steps (the gradient norm over all stages, the copy counted once)
 *     every parameter equals the whole model's within fp32 rounding, and both copies of the
 *     tied embedding are bitwise equal;
 *   - the micro batches in flight through several activation slots at once (all forwards,
 *     then all backwards, in micro batch order as 1F1B takes them) give the same bits as one
 *     at a time.
 * Cases: 2 and 3 ranks, an interleaved split (2 chunks per rank), uneven chunks, chunks
 * without layers (a stage with only the embedding or only the head), tied and untied heads,
 * learned positions and RoPE, hidden dropout; multi-token prediction on the loss's stage
 * and on a stage before it (its streams through a stage without layers too). */
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>

enum { B = 2, T = 8, N = B * T, MB = 3, STEPS = 3, MAXR = 4 };

#define LOSS_RTOL 1e-6
#define TIED_RTOL 1e-5
#define TIED_ATOL 1e-8
#define PARAM_RTOL 1e-4
#define PARAM_ATOL 2e-6

/* a rank's chunks: (first layer, layers, embedding, head), in pipeline order over ranks:
 * chunk c of rank r is virtual stage c * ranks + r */
typedef struct pcase {
    const char *name;
    int layers, ranks, chunks;
    gpt_chunk ch[MAXR][2];
    bool tied, rope;
    float dropout;
    int mtp; /* multi-token prediction depths (0: none) */
} pcase;

static const pcase cases[] = {
    {"2 ranks, 2+2 layers, tied", 4, 2, 1, {{{0, 2, true, false, 0, false, false}}, {{2, 2, false, true, 0, false, false}}}, true, false, 0.1f, 0},
    {"2 ranks, 1+3 layers, untied, rope", 4, 2, 1, {{{0, 1, true, false, 0, false, false}}, {{1, 3, false, true, 0, false, false}}}, false, true, 0, 0},
    {"3 ranks, E|ttt|L (no layers at the ends), tied",
     3, 3, 1, {{{0, 0, true, false, 0, false, false}}, {{0, 3, false, false, 0, false, false}}, {{3, 0, false, true, 0, false, false}}}, true, false, 0.1f, 0},
    {"2 ranks x 2 chunks (interleaved), tied, rope",
     4, 2, 2,
     {{{0, 1, true, false, 0, false, false}, {2, 1, false, false, 0, false, false}}, {{1, 1, false, false, 0, false, false}, {3, 1, false, true, 0, false, false}}},
     true, true, 0.1f, 0},
    /* multi-token prediction: the depths on the loss's stage without a tied embedding (the
     * stage holds a copy of the word embedding for them), and on a stage before it (the
     * layout's m before L: 1 + D streams to the loss's stage, through a stage without
     * layers too) */
    {"2 ranks, Ett|tt+MTP 1 with the head, untied, rope",
     4, 2, 1, {{{0, 2, true, false, 0, false, false}}, {{2, 2, false, true, 0, false, false}}}, false, true, 0, 1},
    {"3 ranks, Ett|tt+MTP 2|L, tied, rope, dropout",
     4, 3, 1,
     {{{0, 2, true, false, 0, false, false}}, {{2, 2, false, false, 0, true, false}}, {{4, 0, false, true, 0, false, true}}},
     true, true, 0.1f, 2},
    {"4 ranks, Ett|MTP 1|-|L, untied, rope",
     2, 4, 1,
     {{{0, 2, true, false, 0, false, false}}, {{2, 0, false, false, 0, true, false}},
      {{2, 0, false, false, 0, false, true}}, {{2, 0, false, true, 0, false, true}}},
     false, true, 0, 1},
};

static gpt_config config(const pcase *k) {
    gpt_config c = {.num_layers = k->layers, .hidden = 32, .heads = 4, .kv_groups = 2, .head_dim = 8,
                    .ffn_hidden = 64, .vocab = 45, .padded_vocab = gpt_padded_vocab(45, 8), .max_positions = T,
                    .rope = k->rope, .rotary_base = 10000.0f, .norm_eps = 1e-5f, .tied = k->tied, .bias = true,
                    .init_std = 0.2f, .hidden_dropout = k->dropout, .mtp_layers = k->mtp, .mtp_loss_scaling = 0.3f};
    return c;
}

typedef struct batch {
    int32_t tok[N], tgt[N], pos[N];
    float mask[N], dscale[N];
    gpt_batch b;
} batch;

static void make_batch(batch *bb, int step, int mb) {
    co_rng r;
    co_rng_seed(&r, 77u + (uint64_t)step * 13u + (uint64_t)mb);
    double ntok = 0;
    for (int i = 0; i < N; i++) {
        bb->tok[i] = (int32_t)(co_rng_next(&r) % 45u);
        bb->tgt[i] = (int32_t)(co_rng_next(&r) % 45u);
        bb->pos[i] = i % T;
        bb->mask[i] = i % 5 == 1 ? 0.0f : 1.0f;
        ntok += bb->mask[i];
    }
    for (int i = 0; i < N; i++) bb->dscale[i] = bb->mask[i] / (float)(ntok * MB);
    bb->b = (gpt_batch){.B = B, .T = T, .tokens = bb->tok, .targets = bb->tgt, .positions = bb->pos,
                        .loss_mask = bb->mask};
}

static uint64_t dseed(int step, int mb) { return 1000u * (uint64_t)step + (uint64_t)mb; }

/* one gradient by global name, from a model */
static const float *grad_of(gpt_model *m, const char *name, size_t *n) {
    const gpt_tensor *t = gpt_tensors(m);
    for (int i = 0; i < gpt_num_tensors(m); i++)
        if (!strcmp(t[i].name, name)) {
            *n = t[i].numel;
            return gpt_grads(m) + t[i].offset;
        }
    return NULL;
}
static const float *param_of(gpt_model *m, const char *name) {
    const gpt_tensor *t = gpt_tensors(m);
    for (int i = 0; i < gpt_num_tensors(m); i++)
        if (!strcmp(t[i].name, name)) return gpt_params(m) + t[i].offset;
    return NULL;
}

typedef struct pipe {
    int nv;                      /* virtual stages: ranks x chunks */
    gpt_model *rank[MAXR];
    opt_adamw opt[MAXR];
} pipe;

/* virtual stage v: chunk v / ranks of rank v % ranks */
#define VR(k, v) ((v) % (k)->ranks)
#define VC(k, v) ((v) / (k)->ranks)

/* One step through the pipeline: forwards and backwards of MB micro batches, either one
 * micro batch at a time (slot 0) or all forwards first (slot = micro batch), then the tied
 * embedding's copies summed, the global norm, AdamW. Returns the losses in loss[MB]. */
static void pipe_step(const pcase *k, pipe *p, int step, bool inflight, double *loss) {
    batch bb[MB];
    size_t xn = (size_t)(1 + k->mtp) * N * 32; /* the most streams a link carries */
    float *x = malloc(sizeof(float) * xn);
    REQUIRE(x);
    for (int r = 0; r < k->ranks; r++) gpt_zero_grad(p->rank[r]);
    for (int mb = 0; mb < MB; mb++) make_batch(&bb[mb], step, mb);
    for (int pass = 0; pass < (inflight ? 2 : 1); pass++)
        for (int q = 0; q < MB; q++) {
            int mb = q, s = inflight ? mb : 0;
            if (!inflight || pass == 0)
                for (int v = 0; v < p->nv; v++) {
                    gpt_model *m = p->rank[VR(k, v)];
                    int c = VC(k, v);
                    size_t in = (size_t)gpt_chunk_streams(m, c, false, true) * N * 32;
                    size_t out = (size_t)gpt_chunk_streams(m, c, true, true) * N * 32;
                    REQUIRE(in <= xn && out <= xn);
                    if (v) memcpy(gpt_chunk_input(m, c, s), x, sizeof(float) * in);
                    double l = gpt_chunk_forward(m, c, s, &bb[mb].b, true, dseed(step, mb), bb[mb].dscale, NULL);
                    if (v + 1 < p->nv) memcpy(x, gpt_chunk_output(m, c, s), sizeof(float) * out);
                    else loss[mb] = l;
                }
            if (!inflight || pass == 1) {
                /* (in flight: the backwards in micro batch order too, so that each gradient
                 * sums its micro batches in the same order) */
                for (int v = p->nv - 1; v >= 0; v--) {
                    gpt_model *m = p->rank[VR(k, v)];
                    int c = VC(k, v);
                    size_t in = (size_t)gpt_chunk_streams(m, c, false, true) * N * 32;
                    size_t out = (size_t)gpt_chunk_streams(m, c, true, true) * N * 32;
                    if (v + 1 < p->nv) memcpy(gpt_chunk_output_grad(m), x, sizeof(float) * out);
                    gpt_chunk_backward(m, c, s, &bb[mb].b, dseed(step, mb));
                    if (v) memcpy(x, gpt_chunk_input_grad(m), sizeof(float) * in);
                }
            }
        }
    for (int r = 0; r < k->ranks; r++) REQUIRE_MSG(!kb_backend_status(gpt_backend(p->rank[r])), "%s", co_err_detail());
    /* the embedding group: the word embedding's copies summed (the first rank's, the last's
     * when tied, the MTP depths' rank's): every rank holding one, and none with one rank */
    float *ge[MAXR];
    int ng = 0;
    size_t en = 0;
    for (int r = 0; r < k->ranks; r++) {
        int ti = gpt_tied_embedding(p->rank[r]);
        size_t n = 0;
        bool holds = grad_of(p->rank[r], "embedding.word_embeddings.weight", &n) != NULL;
        CHECK_MSG(k->ranks > 1 && (k->tied || k->mtp) ? holds == (ti >= 0) : ti < 0,
                  "%s: rank %d: the embedding group membership", k->name, r);
        if (ti < 0) continue;
        const gpt_tensor *t = &gpt_tensors(p->rank[r])[ti];
        CHECK(t->emb_copy == (r > 0));
        ge[ng++] = gpt_grads(p->rank[r]) + t->offset;
        en = t->numel;
    }
    CHECK(ng != 1);
    for (size_t i = 0; i < en && ng > 1; i++) {
        float sum = 0;
        for (int g = 0; g < ng; g++) sum += ge[g][i];
        for (int g = 0; g < ng; g++) ge[g][i] = sum;
    }
    free(x);
}

static void pipe_update(const pcase *k, pipe *p, double lr) {
    double sq = 0;
    for (int r = 0; r < k->ranks; r++) sq += gpt_tp_grad_sumsq(p->rank[r]); /* the copy counted once */
    for (int r = 0; r < k->ranks; r++) opt_adamw_step(&p->opt[r], p->rank[r], lr, sqrt(sq));
}

static void run_case(const pcase *k, kb_backend *be) {
    gpt_config whole = config(k);
    gpt_model *ref = NULL;
    REQUIRE_MSG(!gpt_new(&ref, &whole, be, B, T), "%s: %s", k->name, co_err_detail());
    gpt_init(ref, 5);
    opt_adamw ro;
    REQUIRE(!opt_adamw_init(&ro, ref, 0.9f, 0.95f, 1e-3f, 0.1f, 1.0f));
    pipe p[2] = {{0}, {0}}; /* one micro batch at a time; all in flight */
    for (int w = 0; w < 2; w++) {
        p[w].nv = k->ranks * k->chunks;
        for (int r = 0; r < k->ranks; r++) {
            gpt_config c = whole;
            c.nchunks = k->chunks;
            for (int q = 0; q < k->chunks; q++) {
                c.chunks[q] = k->ch[r][q];
                c.chunks[q].slots = w ? MB : 1;
            }
            REQUIRE_MSG(!gpt_new(&p[w].rank[r], &c, be, B, T), "%s: rank %d: %s", k->name, r, co_err_detail());
            gpt_init(p[w].rank[r], 5);
            REQUIRE(!opt_adamw_init(&p[w].opt[r], p[w].rank[r], 0.9f, 0.95f, 1e-3f, 0.1f, 1.0f));
        }
    }
    /* every tensor of the whole model on exactly one rank (the tied copy aside), same values */
    const gpt_tensor *rt = gpt_tensors(ref);
    for (int i = 0; i < gpt_num_tensors(ref); i++) {
        int holders = 0;
        for (int r = 0; r < k->ranks; r++) {
            const gpt_tensor *t = gpt_tensors(p[0].rank[r]);
            for (int j = 0; j < gpt_num_tensors(p[0].rank[r]); j++)
                if (!strcmp(t[j].name, rt[i].name)) {
                    holders += !t[j].emb_copy;
                    CHECK_MSG(!memcmp(gpt_params(p[0].rank[r]) + t[j].offset, gpt_params(ref) + rt[i].offset,
                                      rt[i].numel * sizeof(float)), "%s: %s initialised differently", k->name, t[j].name);
                }
        }
        CHECK_MSG(holders == 1, "%s: %s held by %d ranks", k->name, rt[i].name, holders);
    }
    double worst_tied = 0, worst_param = 0;
    for (int step = 0; step < STEPS; step++) {
        batch bb[MB];
        double rl[MB];
        gpt_zero_grad(ref);
        for (int mb = 0; mb < MB; mb++) {
            make_batch(&bb[mb], step, mb);
            rl[mb] = gpt_forward(ref, &bb[mb].b, true, dseed(step, mb), bb[mb].dscale, NULL);
            gpt_backward(ref, &bb[mb].b, dseed(step, mb));
        }
        for (int w = 0; w < 2; w++) {
            double pl[MB];
            pipe_step(k, &p[w], step, w == 1, pl);
            for (int mb = 0; mb < MB; mb++)
                CHECK_MSG(step ? fabs(pl[mb] - rl[mb]) <= LOSS_RTOL * fabs(rl[mb]) : pl[mb] == rl[mb],
                          "%s (%s): step %d micro batch %d: loss %.9g vs the whole model's %.9g", k->name,
                          w ? "in flight" : "one at a time", step, mb, pl[mb], rl[mb]);
        }
        if (step == 0) /* gradients by name: bitwise, but the summed tied embedding */
            for (int i = 0; i < gpt_num_tensors(ref); i++) {
                const float *want = gpt_grads(ref) + rt[i].offset;
                bool tied = (k->tied || k->mtp) && !strcmp(rt[i].name, "embedding.word_embeddings.weight") &&
                            k->ranks > 1;
                for (int r = 0; r < k->ranks; r++) {
                    size_t n = 0;
                    const float *g = grad_of(p[0].rank[r], rt[i].name, &n);
                    if (!g) continue;
                    REQUIRE(n == rt[i].numel);
                    if (!tied) {
                        CHECK_MSG(!memcmp(g, want, n * sizeof(float)), "%s: gradient of %s differs", k->name, rt[i].name);
                        continue;
                    }
                    for (size_t e = 0; e < n; e++) {
                        double err = fabs((double)g[e] - want[e]) / (TIED_ATOL + TIED_RTOL * fabs(want[e]));
                        if (err > worst_tied) worst_tied = err;
                    }
                }
            }
        for (int w = 0; w < 2; w++) pipe_update(k, &p[w], 1e-2);
        opt_adamw_step(&ro, ref, 1e-2, opt_grad_norm(ref));
    }
    CHECK_MSG(worst_tied <= 1.0, "%s: the summed tied embedding's gradient: worst error %.2f x tolerance", k->name,
              worst_tied);
    for (int i = 0; i < gpt_num_tensors(ref); i++) {
        const float *want = gpt_params(ref) + rt[i].offset;
        const float *copies[MAXR] = {NULL};
        int nc = 0;
        for (int r = 0; r < k->ranks; r++) {
            const float *q = param_of(p[0].rank[r], rt[i].name);
            if (!q) continue;
            copies[nc++] = q;
            for (size_t e = 0; e < rt[i].numel; e++) {
                double err = fabs((double)q[e] - want[e]) / (PARAM_ATOL + PARAM_RTOL * fabs(want[e]));
                if (err > worst_param) worst_param = err;
            }
        }
        for (int q = 1; q < nc; q++)
            CHECK_MSG(!memcmp(copies[0], copies[q], rt[i].numel * sizeof(float)), "%s: the copies of %s differ", k->name,
                      rt[i].name);
    }
    CHECK_MSG(worst_param <= 1.0, "%s: weights after %d steps: worst error %.2f x tolerance", k->name, STEPS,
              worst_param);
    /* one at a time and in flight: the same bits */
    for (int r = 0; r < k->ranks; r++)
        CHECK_MSG(!memcmp(gpt_params(p[0].rank[r]), gpt_params(p[1].rank[r]), gpt_num_params(p[0].rank[r]) * sizeof(float)),
                  "%s: rank %d: the weights depend on the slots", k->name, r);
    fprintf(stderr, "  %-55s worst error / tolerance: tied gradient %.3f, weights %.3f\n", k->name, worst_tied,
            worst_param);
    for (int w = 0; w < 2; w++)
        for (int r = 0; r < k->ranks; r++) {
            opt_adamw_free(&p[w].opt[r], p[w].rank[r]);
            gpt_destroy(&p[w].rank[r]);
        }
    opt_adamw_free(&ro, ref);
    gpt_destroy(&ref);
}

static void test_cases(void) {
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(!kb_backend_new(&be, &bo));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], be);
    kb_backend_destroy(&be);
}

/* chunks that do not fit: refused with a sentence */
static void test_bad_chunks(void) {
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(!kb_backend_new(&be, &bo));
    pcase k = cases[0];
    gpt_config c = config(&k);
    gpt_model *m = NULL;
    const gpt_chunk bad[][2] = {
        {{0, 5, true, true, 1, false, false}},                          /* past the last layer */
        {{1, 2, true, false, 1, false, false}},                         /* the embedding not at layer 0 */
        {{0, 2, false, true, 1, false, false}},                         /* the head before the last layer */
        {{2, 1, false, false, 1, false, false}, {0, 1, false, false, 1, false, false}}, /* out of order */
    };
    for (size_t i = 0; i < sizeof bad / sizeof bad[0]; i++) {
        c.nchunks = bad[i][1].nlayers ? 2 : 1;
        memcpy(c.chunks, bad[i], sizeof bad[i]);
        CHECK(gpt_new(&m, &c, be, B, T) == CO_EINVAL && !m);
        CHECK_MSG(strstr(co_err_detail(), "does not fit"), "%s", co_err_detail());
    }
    kb_backend_destroy(&be);
}

int main(void) {
    RUN(test_cases);
    RUN(test_bad_chunks);
    return TEST_EXIT();
}
