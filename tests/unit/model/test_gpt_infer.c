/* test_gpt_infer.c - the KV-cache inference forward (model/gpt_infer.h) against the training
 * forward (gpt_forward, dropout off): a prompt prefilled, then one token per step, each
 * position's logits equal to a full forward's over the whole sequence within 1e-5 x (1 +
 * max |logit|) in fp32, for GPT-2's options, a Llama-style model (rope, RMSNorm, SwiGLU,
 * grouped queries, untied, no biases), MoE layers (dropless, router per token) and a model
 * with MTP depths (not run), GPT-2 and Llama options with zero-centred norms
 * (--apply-layernorm-1p); a step past the cache, an id outside the vocabulary and a
 * model split over ranks refused; a reset cache starts again at position 0. */
#include "../../test.h"

#include "common/error.h"
#include "common/rng.h"
#include "model/gpt_infer.h"

enum { V = 45, T = 11, PROMPT = 4 };

typedef struct kcase {
    const char *name;
    bool rope, rms, swiglu, tied, bias;
    int kv_groups, experts, mtp;
    bool norm_1p; /* --apply-layernorm-1p: the norms' stored weights (0 at init) are w - 1 */
} kcase;

static const kcase cases[] = {
    {"gpt2", false, false, false, true, true, 4, 0, 0, false},
    {"llama", true, true, true, false, false, 2, 0, 0, false},
    {"moe", true, false, false, true, false, 4, 4, 0, false},
    {"mtp", true, false, false, true, true, 4, 0, 2, false},
    {"llama-1p", true, true, true, false, false, 2, 0, 0, true},
    {"gpt2-1p", false, false, false, true, true, 4, 0, 0, true},
};

static gpt_config config(const kcase *k) {
    gpt_config c = {.num_layers = 2, .hidden = 32, .heads = 4, .kv_groups = k->kv_groups, .head_dim = 8,
                    .ffn_hidden = 64, .vocab = V, .padded_vocab = gpt_padded_vocab(V, 8), .max_positions = 16,
                    .rope = k->rope, .rotary_base = 10000.0f, .rmsnorm = k->rms, .norm_eps = 1e-5f,
                    .swiglu = k->swiglu, .tied = k->tied, .bias = k->bias, .init_std = 0.3f, .tp = 1,
                    .mtp_layers = k->mtp, .mtp_loss_scaling = 0.3f, .norm_1p = k->norm_1p};
    if (k->experts) {
        c.moe = (moe_config){.num_experts = k->experts, .ffn_hidden = 48, .topk = 2, .score = MOE_SCORE_SOFTMAX,
                             .scaling_factor = 1.0f, .ep_size = 1, .etp_size = 1};
        c.moe_layer_freq = 1;
    }
    return c;
}

/* the cache's logits of every position: PROMPT prefilled, then one token a step */
static int cache_logits(gpt_kv *kv, const int32_t *tok, int Vp, float *out) {
    const float *lg;
    int rc = gpt_kv_step(kv, tok, PROMPT, true, &lg);
    if (rc) return rc;
    memcpy(out, lg, sizeof(float) * PROMPT * (size_t)Vp);
    for (int t = PROMPT; t < T; t++) {
        if ((rc = gpt_kv_step(kv, tok + t, 1, false, &lg))) return rc;
        memcpy(out + (size_t)t * Vp, lg, sizeof(float) * (size_t)Vp);
    }
    return 0;
}

static void run_case(const kcase *k, kb_backend *be) {
    gpt_config c = config(k);
    gpt_model *m = NULL;
    gpt_kv *kv = NULL;
    REQUIRE_MSG(!gpt_new(&m, &c, be, 1, T), "%s: %s", k->name, co_err_detail());
    gpt_init(m, 42);
    REQUIRE_MSG(!gpt_kv_new(&kv, m, T), "%s: %s", k->name, co_err_detail());
    int32_t tok[T], pos[T];
    float mask[T] = {0}, *cache = malloc(sizeof(float) * T * (size_t)c.padded_vocab);
    co_rng r;
    co_rng_seed(&r, 5);
    for (int t = 0; t < T; t++) tok[t] = (int32_t)(co_rng_next(&r) % V), pos[t] = t;
    REQUIRE(cache);
    int rc = cache_logits(kv, tok, c.padded_vocab, cache);
    CHECK_MSG(!rc, "%s: %s", k->name, co_err_detail());
    CHECK(gpt_kv_len(kv) == T);
    /* past the cache: refused, the cache unchanged */
    const float *lg;
    CHECK(gpt_kv_step(kv, tok, 1, false, &lg) == CO_EINVAL && !lg && gpt_kv_len(kv) == T);
    gpt_batch b = {.B = 1, .T = T, .tokens = tok, .targets = tok, .positions = pos, .loss_mask = mask};
    gpt_forward(m, &b, false, 0, NULL, NULL);
    double worst = 0, big = 0;
    for (int t = 0; t < T && !rc; t++) {
        const float *full = gpt_last_logits(m, 0, t);
        for (int v = 0; v < c.padded_vocab; v++) {
            worst = fmax(worst, fabs((double)full[v] - cache[(size_t)t * c.padded_vocab + v]));
            big = fmax(big, fabs((double)full[v]));
        }
    }
    CHECK_MSG(big > 0.1 && worst <= 1e-5 * (1 + big), "%s: max difference %.3g, max |logit| %.3g", k->name, worst, big);
    /* a reset cache gives the same logits again */
    gpt_kv_reset(kv);
    CHECK(gpt_kv_len(kv) == 0);
    float *again = malloc(sizeof(float) * T * (size_t)c.padded_vocab);
    REQUIRE(again);
    CHECK(!cache_logits(kv, tok, c.padded_vocab, again));
    CHECK_MSG(!memcmp(again, cache, sizeof(float) * T * (size_t)c.padded_vocab), "%s: not the same after a reset",
              k->name);
    fprintf(stderr, "  %s: max |cache - full forward| %.3g (max |logit| %.3g)\n", k->name, worst, big);
    free(again);
    free(cache);
    gpt_kv_destroy(&kv);
    gpt_destroy(&m);
}

static void test_cache_vs_full_forward(void) {
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(!kb_backend_new(&be, &bo));
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i], be);
    kb_backend_destroy(&be);
}

static void test_refused(void) {
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(!kb_backend_new(&be, &bo));
    gpt_config c = config(&cases[0]);
    gpt_model *m = NULL;
    gpt_kv *kv = NULL;
    REQUIRE(!gpt_new(&m, &c, be, 1, T));
    gpt_init(m, 1);
    /* more positions than the learned table has */
    CHECK(gpt_kv_new(&kv, m, 17) == CO_EINVAL && !kv);
    CHECK_MSG(strstr(co_err_detail(), "16 learned positions"), "%s", co_err_detail());
    REQUIRE(!gpt_kv_new(&kv, m, T));
    const float *lg;
    int32_t bad[2] = {3, V};
    CHECK(gpt_kv_step(kv, bad, 2, false, &lg) == CO_EINVAL && gpt_kv_len(kv) == 0);
    CHECK_MSG(strstr(co_err_detail(), "outside the vocabulary"), "%s", co_err_detail());
    int32_t many[T + 1] = {0};
    CHECK(gpt_kv_step(kv, many, T + 1, false, &lg) == CO_EINVAL);
    gpt_kv_destroy(&kv);
    gpt_destroy(&m);
    /* a tensor-parallel rank's model */
    c.tp = 2;
    c.tp_rank = 0;
    c.padded_vocab = gpt_padded_vocab(V, 16);
    REQUIRE_MSG(!gpt_new(&m, &c, be, 1, T), "%s", co_err_detail());
    CHECK(gpt_kv_new(&kv, m, T) == CO_EINVAL && !kv);
    CHECK_MSG(strstr(co_err_detail(), "one process"), "%s", co_err_detail());
    gpt_destroy(&m);
    kb_backend_destroy(&be);
}

int main(void) {
    RUN(test_cache_vs_full_forward);
    RUN(test_refused);
    return TEST_EXIT();
}
