/* test_gpu_model.c - a tiny GPT on the CUDA backend against the same model on the CPU
 * backend: forward loss and every gradient (fp32 and bf16, dropout and document masks on),
 * a few hundred training steps whose losses track the CPU run, and bitwise repeatability of
 * training steps on the GPU. Exits 77 without a GPU. */
#include "tests/gpu/gpu_util.h"

#include "common/rng.h"
#include "model/gpt.h"
#include "optim/adamw.h"

enum { B = 2, T = 37, MAXN = B * T };

typedef struct batch_buf {
    int32_t tok[MAXN], tgt[MAXN], pos[MAXN], seg[MAXN];
    float mask[MAXN], dscale[MAXN];
    gpt_batch b;
} batch_buf;

/* random tokens, or (learnable) a fixed cyclic pattern per sequence */
static void make_batch(batch_buf *bb, int V, uint64_t seed, bool pattern) {
    co_rng r;
    co_rng_seed(&r, seed);
    for (int s = 0; s < B; s++) {
        int start = (int)(co_rng_next(&r) % (uint64_t)V);
        for (int t = 0; t < T; t++) {
            int i = s * T + t;
            bb->tok[i] = pattern ? (start + 3 * t) % V : (int32_t)(co_rng_next(&r) % (uint64_t)V);
            bb->tgt[i] = pattern ? (start + 3 * t + 3) % V : (int32_t)(co_rng_next(&r) % (uint64_t)V);
            bb->pos[i] = t;
            bb->seg[i] = t >= 20 ? 20 : (t >= 9 ? 9 : 0); /* three documents */
            bb->mask[i] = i % 5 == 3 ? 0.0f : 1.0f;
        }
    }
    double ntok = 0;
    for (int i = 0; i < MAXN; i++) ntok += bb->mask[i];
    for (int i = 0; i < MAXN; i++) bb->dscale[i] = bb->mask[i] / (float)ntok;
    bb->b = (gpt_batch){.B = B, .T = T, .tokens = bb->tok, .targets = bb->tgt, .positions = bb->pos,
                        .seg = bb->seg, .loss_mask = bb->mask};
}

static gpt_config config(int kind) {
    gpt_config c = {.num_layers = 2, .hidden = 48, .heads = 4, .kv_groups = 4, .head_dim = 12, .ffn_hidden = 96,
                    .vocab = 97, .padded_vocab = 128, .max_positions = 64, .rope = false, .rotary_base = 10000.0f,
                    .rmsnorm = false, .norm_eps = 1e-5f, .swiglu = false, .tied = true, .bias = true,
                    .init_std = 0.05f, .hidden_dropout = 0.1f, .attention_dropout = 0.1f};
    if (kind == 1) { /* llama-like: rope, RMSNorm, SwiGLU, grouped queries, untied, no biases */
        c.rope = true, c.rmsnorm = true, c.swiglu = true, c.kv_groups = 2, c.tied = false, c.bias = false;
        c.ffn_hidden = 64;
    }
    return c;
}

static void grads_case(int kind, bool bf16) {
    char label[64];
    snprintf(label, sizeof label, "%s %s", kind ? "llama-like" : "gpt2-like", bf16 ? "bf16" : "fp32");
    gpt_config cfg = config(kind);
    kb_backend *cb = gu_backend(KB_DEVICE_CPU, bf16), *gb = gu_backend(KB_DEVICE_CUDA, bf16);
    gpt_model *cm = NULL, *gm = NULL;
    REQUIRE(gpt_new(&cm, &cfg, cb, B, T) == 0);
    REQUIRE(gpt_new(&gm, &cfg, gb, B, T) == 0);
    gpt_init(cm, 11);
    gpt_init(gm, 11);
    size_t np = gpt_num_params(cm);
    float *gp = gu_fetch(gb, gpt_params(gm), np);
    GU_EQUAL("initial parameters", gp, gpt_params(cm), np * sizeof(float));
    free(gp);
    batch_buf bb;
    make_batch(&bb, cfg.vocab, 5, false);
    float lc[MAXN], lg[MAXN];
    double sc = gpt_forward(cm, &bb.b, true, 42, bb.dscale, lc);
    double sg = gpt_forward(gm, &bb.b, true, 42, bb.dscale, lg);
    double tol = bf16 ? 1e-2 : 1e-5;
    CHECK_MSG(fabs(sc - sg) <= tol * fabs(sc), "%s: loss sum gpu %.9g cpu %.9g", label, sg, sc);
    GU_CLOSE(label, lg, lc, MAXN, bf16 ? 2e-2 : 1e-5, bf16 ? 1e-2 : 1e-5);
    gpt_zero_grad(cm);
    gpt_zero_grad(gm);
    gpt_backward(cm, &bb.b, 42);
    gpt_backward(gm, &bb.b, 42);
    CHECK_MSG(gb->status == 0, "%s: backend status %d: %s", label, gb->status, co_err_detail());
    float *gg = gu_fetch(gb, gpt_grads(gm), np), *cg = gpt_grads(cm);
    const gpt_tensor *ts = gpt_tensors(cm);
    for (int i = 0; i < gpt_num_tensors(cm); i++) {
        const gpt_tensor *t = &ts[i];
        double mx = 0;
        for (size_t k = 0; k < t->numel; k++) mx = fmax(mx, fabs(cg[t->offset + k]));
        CHECK_MSG(mx > 0, "%s: %s has an all-zero gradient on the CPU", label, t->name);
        char l2[160];
        snprintf(l2, sizeof l2, "%s grad %s", label, t->name);
        GU_CLOSE(l2, gg + t->offset, cg + t->offset, t->numel, (bf16 ? 3e-2 : 2e-4) * mx, bf16 ? 3e-2 : 1e-3);
    }
    free(gg);
    gpt_destroy(&cm);
    gpt_destroy(&gm);
    kb_backend_destroy(&cb);
    kb_backend_destroy(&gb);
}

static void test_gradients(void) {
    for (int kind = 0; kind < 2; kind++) {
        grads_case(kind, false);
        grads_case(kind, true);
    }
}

/* steps of AdamW on the learnable pattern; losses[s] = mean masked loss of step s */
static void train(kb_device dev, bool bf16, int kind, int steps, double *losses, float *final_params) {
    gpt_config cfg = config(kind);
    cfg.hidden_dropout = cfg.attention_dropout = 0.0f;
    kb_backend *be = gu_backend(dev, bf16);
    gpt_model *m = NULL;
    if (gpt_new(&m, &cfg, be, B, T)) exit(1);
    gpt_init(m, 3);
    opt_adamw opt;
    if (opt_adamw_init(&opt, m, 0.9f, 0.95f, 1e-8f, 0.01f, 1.0f)) exit(1);
    batch_buf bb;
    for (int s = 0; s < steps; s++) {
        make_batch(&bb, cfg.vocab, 100 + (uint64_t)s, true);
        double ntok = 0;
        for (int i = 0; i < MAXN; i++) ntok += bb.mask[i];
        gpt_zero_grad(m);
        losses[s] = gpt_forward(m, &bb.b, true, (uint64_t)s, bb.dscale, NULL) / ntok;
        gpt_backward(m, &bb.b, (uint64_t)s);
        double gn = opt_grad_norm(m);
        opt_adamw_step(&opt, m, 3e-3, gn);
    }
    if (final_params) be->ops->copy(be, final_params, gpt_params(m), gpt_num_params(m) * sizeof(float));
    if (be->status) fprintf(stderr, "train: backend status %d: %s\n", be->status, co_err_detail());
    opt_adamw_free(&opt, m);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
}

static void test_loss_tracks_cpu(void) {
    enum { S = 300 };
    for (int kind = 0; kind < 2; kind++)
        for (int bf = 0; bf < 2; bf++) {
            double lc[S], lg[S];
            train(KB_DEVICE_CPU, bf, kind, S, lc, NULL);
            train(KB_DEVICE_CUDA, bf, kind, S, lg, NULL);
            /* the same trajectory within rounding drift: compare every step, looser later */
            int bad = 0;
            for (int s = 0; s < S; s++) {
                double tol = (bf ? 0.05 : 0.01) + (bf ? 0.05 : 0.02) * fabs(lc[s]) * ((double)s / S);
                if (!(fabs(lg[s] - lc[s]) <= tol) && bad++ < 3)
                    fprintf(stderr, "kind %d bf16 %d step %d: gpu %.6f cpu %.6f\n", kind, bf, s, lg[s], lc[s]);
            }
            CHECK_MSG(bad == 0, "kind %d bf16 %d: %d steps off the CPU's loss", kind, bf, bad);
            CHECK_MSG(lg[S - 1] < 0.5 * lg[0], "kind %d bf16 %d: the GPU run did not learn (%.3f -> %.3f)", kind, bf,
                      lg[0], lg[S - 1]);
            fprintf(stderr, "kind %d bf16 %d: loss %.4f -> cpu %.4f gpu %.4f\n", kind, bf, lc[0], lc[S - 1], lg[S - 1]);
        }
}

static void test_deterministic(void) {
    enum { S = 20 };
    for (int bf = 0; bf < 2; bf++) {
        gpt_config cfg = config(0);
        kb_backend *be = gu_backend(KB_DEVICE_CUDA, bf);
        gpt_model *m = NULL;
        REQUIRE(gpt_new(&m, &cfg, be, B, T) == 0);
        size_t np = gpt_num_params(m);
        gpt_destroy(&m);
        kb_backend_destroy(&be);
        float *p1 = malloc(np * sizeof(float)), *p2 = malloc(np * sizeof(float));
        double l1[S], l2[S];
        train(KB_DEVICE_CUDA, bf, 0, S, l1, p1);
        train(KB_DEVICE_CUDA, bf, 0, S, l2, p2);
        CHECK_MSG(memcmp(l1, l2, sizeof l1) == 0, "bf16 %d: losses of two runs differ", bf);
        CHECK_MSG(memcmp(p1, p2, np * sizeof(float)) == 0, "bf16 %d: parameters of two runs differ", bf);
        free(p1), free(p2);
    }
}

int main(void) {
    gu_require_gpu();
    RUN(test_gradients);
    RUN(test_deterministic);
    RUN(test_loss_tracks_cpu);
    return TEST_EXIT();
}
