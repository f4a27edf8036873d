/* test_gpt.c - the whole model against finite differences, determinism of training steps,
 * and a learnable synthetic task whose loss must fall below a bound. */
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/gpt.h"
#include "optim/adamw.h"
#include "tests/test.h"

#include <math.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>

static kb_backend *backend(bool bf16) {
    kb_backend *be = NULL;
    kb_options o = {.device = KB_DEVICE_CPU, .threads = 2, .bf16 = bf16};
    if (kb_backend_new(&be, &o)) return NULL;
    return be;
}

typedef struct batch_buf {
    int32_t tok[64], tgt[64], pos[64], seg[64];
    float mask[64], dscale[64];
    gpt_batch b;
} batch_buf;

static void make_batch(batch_buf *bb, int B, int T, int V, uint64_t seed, bool reset) {
    co_rng r;
    co_rng_seed(&r, seed);
    for (int i = 0; i < B * T; i++) {
        bb->tok[i] = (int32_t)(co_rng_next(&r) % (uint64_t)V);
        bb->tgt[i] = (int32_t)(co_rng_next(&r) % (uint64_t)V);
        int t = i % T;
        bb->pos[i] = t;
        /* a document boundary at t = T/2 when reset */
        bb->seg[i] = reset && t >= T / 2 ? T / 2 : 0;
        bb->mask[i] = (i % 5 == 3) ? 0.0f : 1.0f;
    }
    double ntok = 0;
    for (int i = 0; i < B * T; i++) ntok += bb->mask[i];
    for (int i = 0; i < B * T; i++) bb->dscale[i] = bb->mask[i] / (float)ntok;
    bb->b = (gpt_batch){.B = B, .T = T, .tokens = bb->tok, .targets = bb->tgt, .positions = bb->pos,
                        .seg = reset ? bb->seg : NULL, .loss_mask = bb->mask};
}

/* mean masked loss, in double from the model's float per-token losses */
static double loss_of(gpt_model *m, batch_buf *bb, uint64_t dseed) {
    double ntok = 0;
    for (int i = 0; i < bb->b.B * bb->b.T; i++) ntok += bb->mask[i];
    double l = gpt_forward(m, &bb->b, true, dseed, bb->dscale, NULL) / ntok;
    /* multi-token prediction: the objective adds scale / D x each depth's mean loss */
    const gpt_config *c = gpt_get_config(m);
    if (c->mtp_layers > 0) {
        double d[GPT_MAX_MTP];
        gpt_mtp_last_losses(m, d);
        for (int k = 0; k < c->mtp_layers; k++) l += c->mtp_loss_scaling / c->mtp_layers * d[k];
    }
    return l;
}

/* every weight += normal(0, std) from seed */
static void perturb(gpt_model *m, uint64_t seed, double std) {
    float *p = gpt_params(m);
    const gpt_tensor *ts = gpt_tensors(m);
    co_rng r;
    co_rng_seed(&r, seed);
    for (int i = 0; i < gpt_num_tensors(m); i++)
        for (size_t k = 0; k < ts[i].numel; k++) p[ts[i].offset + k] += (float)(std * co_rng_normal(&r));
}

static void grad_check(gpt_config cfg, bool reset, const char *label) {
    kb_backend *be = backend(false);
    REQUIRE(be);
    gpt_model *m = NULL;
    int B = 2, T = 8;
    REQUIRE(gpt_new(&m, &cfg, be, B, T) == 0);
    gpt_init(m, 7);
    /* larger weights than the default init so every path carries a visible gradient */
    perturb(m, 99, 0.3);
    float *p = gpt_params(m);
    const gpt_tensor *ts = gpt_tensors(m);
    batch_buf bb;
    make_batch(&bb, B, T, cfg.vocab, 5, reset);
    uint64_t dseed = 42;
    gpt_zero_grad(m);
    loss_of(m, &bb, dseed);
    gpt_backward(m, &bb.b, dseed);
    float *g = malloc(sizeof(float) * gpt_num_params(m));
    REQUIRE(g);
    memcpy(g, gpt_grads(m), sizeof(float) * gpt_num_params(m));
    int bad = 0, checked = 0;
    double worst = 0;
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        const gpt_tensor *t = &ts[i];
        /* a few entries of every tensor, spread over it */
        for (int s = 0; s < 6; s++) {
            size_t k = t->offset + (size_t)((s * 2654435761u) % t->numel);
            float save = p[k];
            /* central differences at h and h/2, Richardson-extrapolated to cancel the h^2 term */
            double d[2];
            for (int j = 0; j < 2; j++) {
                float h = j ? 5e-3f : 1e-2f;
                p[k] = save + h;
                double lp = loss_of(m, &bb, dseed);
                p[k] = save - h;
                double lm = loss_of(m, &bb, dseed);
                p[k] = save;
                d[j] = (lp - lm) / (2.0 * h);
            }
            double fd = (4.0 * d[1] - d[0]) / 3.0;
            double err = fabs(fd - g[k]);
            double tol = 3e-4 + 3e-2 * fabs(fd);
            checked++;
            if (err > tol) {
                if (bad < 5) fprintf(stderr, "  %s: %s[%zu] fd %.6g analytic %.6g\n", label, t->name, k - t->offset, fd, g[k]);
                bad++;
            }
            if (err > worst) worst = err;
        }
    }
    CHECK_MSG(bad == 0, "%s: %d of %d gradient entries disagree with finite differences", label, bad, checked);
    free(g);
    gpt_destroy(&m);
    CHECK(m == NULL);
    kb_backend_destroy(&be);
}

static gpt_config tiny(void) {
    gpt_config c = {.num_layers = 2, .hidden = 16, .heads = 4, .kv_groups = 4, .head_dim = 4, .ffn_hidden = 32,
                    .vocab = 37, .padded_vocab = gpt_padded_vocab(37, 8), .max_positions = 16, .rope = false,
                    .rotary_base = 10000.0f, .rmsnorm = false, .norm_eps = 1e-5f, .swiglu = false, .tied = true,
                    .bias = true, .init_std = 0.02f, .hidden_dropout = 0.0f, .attention_dropout = 0.0f};
    return c;
}

static void test_grad_gpt2_style(void) { grad_check(tiny(), false, "layernorm/learned/gelu/tied"); }

static void test_grad_llama_style(void) {
    gpt_config c = tiny();
    c.rope = true;
    c.rmsnorm = true;
    c.swiglu = true;
    c.tied = false;
    c.bias = false;
    c.kv_groups = 2;
    grad_check(c, false, "rmsnorm/rope/swiglu/untied/gqa");
}

static void test_grad_dropout_and_reset_mask(void) {
    gpt_config c = tiny();
    c.hidden_dropout = 0.2f;
    c.attention_dropout = 0.2f;
    grad_check(c, true, "dropout/reset-attention-mask");
}

/* Trains a few steps; returns a malloc'd copy of the parameters. */
static float *train_steps(gpt_config cfg, int steps, bool bf16, double *final_loss) {
    kb_backend *be = backend(bf16);
    if (!be) return NULL;
    gpt_model *m = NULL;
    int B = 4, T = 16;
    if (gpt_new(&m, &cfg, be, B, T)) return NULL;
    gpt_init(m, 1234);
    opt_adamw opt;
    opt_adamw_init(&opt, m, 0.9f, 0.95f, 1e-8f, 0.01f, 1.0f);
    int32_t tok[64], tgt[64], pos[64];
    float mask[64], dscale[64];
    co_rng r;
    co_rng_seed(&r, 3);
    double loss = 0;
    for (int s = 0; s < steps; s++) {
        /* learnable task: each sequence counts up from a random start, modulo the vocabulary */
        for (int b = 0; b < B; b++) {
            int start = (int)(co_rng_next(&r) % (uint64_t)cfg.vocab);
            for (int t = 0; t < T; t++) {
                int i = b * T + t;
                tok[i] = (start + t) % cfg.vocab;
                tgt[i] = (start + t + 1) % cfg.vocab;
                pos[i] = t;
                mask[i] = 1;
                dscale[i] = 1.0f / (float)(B * T);
            }
        }
        gpt_batch bt = {.B = B, .T = T, .tokens = tok, .targets = tgt, .positions = pos, .seg = NULL, .loss_mask = mask};
        gpt_zero_grad(m);
        loss = gpt_forward(m, &bt, true, (uint64_t)s, dscale, NULL) / (B * T);
        gpt_backward(m, &bt, (uint64_t)s);
        /* the checksum of what the step wrote is the weights' checksum after it */
        uint64_t written = 0;
        opt_adamw_step_checksum(&opt, m, 3e-3, opt_grad_norm(m), &written);
        CHECK(written == gpt_weights_checksum(m) && written != 0);
        CHECK((gpt_params_bf16(m) != NULL) == bf16 && (gpt_weights_checksum16(m) != 0) == bf16);
    }
    *final_loss = loss;
    float *copy = malloc(sizeof(float) * gpt_num_params(m));
    if (copy) memcpy(copy, gpt_params(m), sizeof(float) * gpt_num_params(m));
    opt_adamw_free(&opt, m);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
    return copy;
}

static void test_bitwise_repeatable(void) {
    gpt_config c = tiny();
    c.hidden_dropout = 0.1f;
    c.attention_dropout = 0.1f;
    double l1, l2;
    float *a = train_steps(c, 20, false, &l1);
    float *b = train_steps(c, 20, false, &l2);
    REQUIRE(a && b);
    kb_backend *be = backend(false);
    gpt_model *m = NULL;
    REQUIRE(gpt_new(&m, &c, be, 4, 16) == 0);
    size_t n = gpt_num_params(m);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
    CHECK(memcmp(a, b, n * sizeof(float)) == 0);
    CHECK(l1 == l2);
    free(a);
    free(b);
}

static void test_learns_counting(void) {
    gpt_config c = tiny();
    c.hidden = 32;
    c.head_dim = 8;
    c.ffn_hidden = 64;
    double loss;
    float *p = train_steps(c, 150, false, &loss);
    REQUIRE(p);
    /* chance is log(37) = 3.61 nats; the task is deterministic given the previous token */
    CHECK_MSG(loss < 0.5, "loss after 150 steps: %.4f", loss);
    free(p);
}

static void test_learns_counting_bf16(void) {
    gpt_config c = tiny();
    c.hidden = 32;
    c.head_dim = 8;
    c.ffn_hidden = 64;
    char why[400];
    if (!kb_cpu_bf16_check(why, sizeof why)) TEST_SKIP_CASE(why);
    double loss;
    float *p = train_steps(c, 150, true, &loss);
    REQUIRE(p);
    CHECK_MSG(loss < 0.6, "bf16 loss after 150 steps: %.4f", loss);
    free(p);
}

static void test_param_layout(void) {
    kb_backend *be = backend(false);
    REQUIRE(be);
    gpt_config c = tiny();
    gpt_model *m = NULL;
    REQUIRE(gpt_new(&m, &c, be, 1, 8) == 0);
    const gpt_tensor *t = gpt_tensors(m);
    size_t expect = 0;
    int decayed = 0;
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        CHECK(t[i].offset % 16 == 0);
        CHECK(t[i].offset >= expect);
        expect = t[i].offset + t[i].numel;
        if (t[i].decay) { decayed++; CHECK(t[i].ndim == 2); }
        else CHECK(t[i].ndim == 1);
    }
    CHECK(expect <= gpt_num_params(m));
    CHECK(!strcmp(t[0].name, "embedding.word_embeddings.weight") && t[0].shape[0] == 40);
    /* 2 layers x (qkv, proj, fc1, fc2) + wte + wpe */
    CHECK(decayed == 10);
    gpt_init(m, 1);
    /* output projections use std / sqrt(2L) */
    for (int i = 0; i < gpt_num_tensors(m); i++) {
        if (strstr(t[i].name, "proj.weight") || strstr(t[i].name, "fc2.weight"))
            CHECK(fabsf(t[i].init_std - 0.01f) < 1e-7f);
        else if (t[i].decay)
            CHECK(fabsf(t[i].init_std - 0.02f) < 1e-7f);
    }
    gpt_destroy(&m);
    kb_backend_destroy(&be);
}

/* ---------------------------------------------------------------- mixture of experts */

static gpt_config tiny_moe(int E, int k, int freq) {
    gpt_config c = tiny();
    c.bias = false;
    c.moe = (moe_config){.num_experts = E, .ffn_hidden = 24, .topk = k, .score = MOE_SCORE_SOFTMAX,
                         .lb = MOE_LB_AUX, .drop = MOE_DROP_PROBS};
    c.moe_layer_freq = freq;
    return c;
}

/* Every expert selected (top-k = E, so no routing decision flips under a finite-difference
 * step), the losses' coefficients 0 (finite differences see the language-model loss only):
 * every router, expert and shared-expert gradient entry against finite differences; and
 * with a dense layer between MoE layers (--moe-layer-freq 2). */
static void test_grad_moe(void) {
    gpt_config c = tiny_moe(4, 4, 1);
    c.moe.shared_ffn = 12;
    grad_check(c, false, "moe: 4 experts, shared expert, gelu");
    c = tiny_moe(3, 3, 2);
    c.num_layers = 3;
    c.swiglu = true;
    c.rmsnorm = true;
    c.moe.score = MOE_SCORE_SIGMOID;
    grad_check(c, true, "moe: sigmoid, swiglu, every second layer, reset mask");
}

/* One expert, top-1 (its probability is 1): the MoE layer is the dense MLP. The same weights
 * in both models give the same loss and gradients (within float rounding of the permuted
 * rows), the tensor table names the expert by its global index, and the MoE layer's block
 * is one unpadded run in moe.h's layout. */
static void test_moe_one_expert_is_dense(void) {
    kb_backend *be = backend(false);
    REQUIRE(be);
    gpt_config cd = tiny();
    cd.bias = false;
    cd.ffn_hidden = 24;
    gpt_config cm = tiny_moe(1, 1, 1);
    gpt_model *d = NULL, *m = NULL;
    REQUIRE(gpt_new(&d, &cd, be, 2, 8) == 0 && gpt_new(&m, &cm, be, 2, 8) == 0);
    gpt_init(d, 3);
    gpt_init(m, 3);
    const gpt_tensor *td = gpt_tensors(d), *tm = gpt_tensors(m);
    /* copy every dense tensor to the MoE model's by name (fc1/fc2 to expert 0's) */
    char name[80];
    int copied = 0, routers = 0;
    for (int j = 0; j < gpt_num_tensors(m); j++) {
        if (strstr(tm[j].name, "router")) {
            routers++;
            continue;
        }
        snprintf(name, sizeof name, "%s", tm[j].name);
        char *e = strstr(name, "experts.0.");
        if (e) memmove(e, e + strlen("experts.0."), strlen(e + strlen("experts.0.")) + 1);
        for (int i = 0; i < gpt_num_tensors(d); i++)
            if (!strcmp(td[i].name, name)) {
                CHECK(td[i].numel == tm[j].numel);
                memcpy(gpt_params(m) + tm[j].offset, gpt_params(d) + td[i].offset, sizeof(float) * td[i].numel);
                copied++;
            }
    }
    CHECK(routers == 2 && copied == gpt_num_tensors(m) - 2);
    for (int j = 0; j < gpt_num_tensors(m); j++)
        if (strstr(tm[j].name, "router")) {
            /* the block: router [E,C], expert fc1, expert fc2, contiguous */
            CHECK(!strncmp(tm[j + 1].name, tm[j].name, 9) && strstr(tm[j + 1].name, "mlp.experts.0.fc1.weight"));
            CHECK(tm[j + 1].offset == tm[j].offset + tm[j].numel && tm[j + 2].offset == tm[j + 1].offset + tm[j + 1].numel);
        }
    batch_buf bb;
    make_batch(&bb, 2, 8, cd.vocab, 11, false);
    gpt_zero_grad(d);
    gpt_zero_grad(m);
    double ld = loss_of(d, &bb, 1), lm = loss_of(m, &bb, 1);
    gpt_backward(d, &bb.b, 1);
    gpt_backward(m, &bb.b, 1);
    CHECK_MSG(fabs(ld - lm) <= 1e-6 * fabs(ld), "dense %.9g, one expert %.9g", ld, lm);
    double worst = 0;
    for (int j = 0; j < gpt_num_tensors(m); j++) {
        if (strstr(tm[j].name, "router")) continue;
        snprintf(name, sizeof name, "%s", tm[j].name);
        char *e = strstr(name, "experts.0.");
        if (e) memmove(e, e + strlen("experts.0."), strlen(e + strlen("experts.0.")) + 1);
        for (int i = 0; i < gpt_num_tensors(d); i++)
            if (!strcmp(td[i].name, name))
                for (size_t k = 0; k < td[i].numel; k++)
                    worst = fmax(worst, fabs((double)gpt_grads(d)[td[i].offset + k] - gpt_grads(m)[tm[j].offset + k]));
    }
    CHECK_MSG(worst <= 1e-6, "gradients differ by %.3g", worst);
    gpt_destroy(&d);
    gpt_destroy(&m);
    /* refused: tensor parallelism, biases */
    cm.tp = 2;
    CHECK(gpt_new(&m, &cm, be, 2, 8) == CO_EUNSUPPORTED);
    cm = tiny_moe(4, 2, 1);
    cm.bias = true;
    CHECK(gpt_new(&m, &cm, be, 2, 8) == CO_EINVAL && strstr(co_err_detail(), "--disable-bias-linear"));
    kb_backend_destroy(&be);
}

/* ---------------------------------------------------------------- multi-token prediction */

/* Two MTP depths on a GPT-2-style model and on a llama-style one (rope, RMSNorm, SwiGLU,
 * untied, dropout): every gradient entry, the MTP tensors' included, against finite
 * differences of the main loss plus scale / D x each depth's loss. */
static void test_grad_mtp(void) {
    gpt_config c = tiny();
    c.mtp_layers = 2;
    c.mtp_loss_scaling = 0.3f;
    grad_check(c, false, "mtp: 2 depths, layernorm/learned/gelu/tied");
    c.rope = true;
    c.rmsnorm = true;
    c.swiglu = true;
    c.tied = false;
    c.bias = false;
    c.mtp_layers = 1;
    c.mtp_loss_scaling = 1.0f;
    c.hidden_dropout = 0.1f;
    grad_check(c, false, "mtp: 1 depth, rmsnorm/rope/swiglu/untied/dropout");
}

/* --apply-layernorm-1p: every norm weight (the layers', the final norm's, the MTP depth's
 * three) starts at 0, and a model whose stored weights are w computes bitwise what the plain
 * model with weights 1 + w computes: the loss, the MTP loss and every gradient (d(1+w)/dw = 1);
 * with LayerNorm and with RMSNorm, and its gradients against finite differences. */
static void layernorm_1p_case(gpt_config c, const char *label) {
    kb_backend *be = backend(false);
    REQUIRE(be);
    gpt_config c1 = c;
    c1.norm_1p = true;
    gpt_model *a = NULL, *b = NULL;
    REQUIRE(gpt_new(&a, &c1, be, 2, 8) == 0 && gpt_new(&b, &c, be, 2, 8) == 0);
    gpt_init(a, 5);
    const gpt_tensor *ta = gpt_tensors(a), *tb = gpt_tensors(b);
    REQUIRE(gpt_num_tensors(a) == gpt_num_tensors(b));
    int norms = 0;
    for (int i = 0; i < gpt_num_tensors(a); i++)
        if (strstr(ta[i].name, "norm.weight")) {
            norms++;
            for (size_t k = 0; k < ta[i].numel; k++) CHECK(gpt_params(a)[ta[i].offset + k] == 0.0f);
        }
    CHECK_MSG(norms == 2 * c.num_layers + 1 + 5 * c.mtp_layers, "%s: %d norm weights", label, norms);
    perturb(a, 9, 0.1);
    for (int i = 0; i < gpt_num_tensors(a); i++) {
        CHECK(!strcmp(ta[i].name, tb[i].name) && ta[i].numel == tb[i].numel);
        bool norm = strstr(ta[i].name, "norm.weight") != NULL;
        for (size_t k = 0; k < ta[i].numel; k++) {
            float w = gpt_params(a)[ta[i].offset + k];
            gpt_params(b)[tb[i].offset + k] = norm ? 1.0f + w : w;
        }
    }
    batch_buf bb;
    make_batch(&bb, 2, 8, c.vocab, 17, false);
    gpt_zero_grad(a);
    gpt_zero_grad(b);
    double la = loss_of(a, &bb, 1), lb = loss_of(b, &bb, 1);
    gpt_backward(a, &bb.b, 1);
    gpt_backward(b, &bb.b, 1);
    CHECK_MSG(la == lb, "%s: loss %.9g with 1p, %.9g with 1 + w", label, la, lb);
    CHECK_MSG(!memcmp(gpt_grads(a), gpt_grads(b), gpt_num_params(a) * sizeof(float)), "%s: gradients differ", label);
    gpt_destroy(&a);
    gpt_destroy(&b);
    kb_backend_destroy(&be);
    grad_check(c1, false, label);
}

static void test_layernorm_1p(void) {
    gpt_config c = tiny();
    c.mtp_layers = 1;
    c.mtp_loss_scaling = 0.5f;
    layernorm_1p_case(c, "layernorm-1p: layernorm/learned/gelu/tied/mtp");
    c.rope = true;
    c.rmsnorm = true;
    c.swiglu = true;
    c.tied = false;
    c.bias = false;
    layernorm_1p_case(c, "layernorm-1p: rmsnorm/rope/swiglu/untied/mtp");
}

/* ---- against PyTorch (tests/data/mtp_torch_ref.py) ---- */

static const char *g_python, *g_mtp_script;

static bool write_bin(const char *dir, const char *name, const void *p, size_t n) {
    char path[600];
    snprintf(path, sizeof path, "%s/%s", dir, name);
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

/* The model's weights (perturbed as grad_check's), one micro batch, cohort's losses and
 * gradient of the objective (main loss + scale / D x each depth's) into dir. */
static bool dump_mtp_case(const char *root, const char *label, gpt_config cfg) {
    char dir[600];
    snprintf(dir, sizeof dir, "%s/%s", root, label);
    if (mkdir(dir, 0700)) return false;
    kb_backend *be = backend(false);
    gpt_model *m = NULL;
    int B = 2, T = 8;
    if (!be || gpt_new(&m, &cfg, be, B, T)) return false;
    gpt_init(m, 17);
    perturb(m, 23, 0.2);
    float *p = gpt_params(m);
    const gpt_tensor *ts = gpt_tensors(m);
    batch_buf bb;
    make_batch(&bb, B, T, cfg.vocab, 31, false);
    gpt_zero_grad(m);
    double ntok = 0;
    for (int i = 0; i < B * T; i++) ntok += bb.mask[i];
    double main = gpt_forward(m, &bb.b, true, 1, bb.dscale, NULL) / ntok;
    double dl[GPT_MAX_MTP];
    gpt_mtp_last_losses(m, dl);
    gpt_backward(m, &bb.b, 1);
    char txt[4096];
    int len = snprintf(txt, sizeof txt,
                       "layers=%d\nhidden=%d\nheads=%d\nkv_groups=%d\nhead_dim=%d\nffn=%d\npadded_vocab=%d\nB=%d\nT=%d\n"
                       "mtp=%d\nnorm_eps=%.9e\nrotary_base=%.9e\nmtp_scale=%.9e\nrmsnorm=%d\nrope=%d\nswiglu=%d\n"
                       "tied=%d\nbias=%d\n",
                       cfg.num_layers, cfg.hidden, cfg.heads, cfg.kv_groups, cfg.head_dim, cfg.ffn_hidden,
                       cfg.padded_vocab, B, T, cfg.mtp_layers, (double)cfg.norm_eps, (double)cfg.rotary_base,
                       (double)cfg.mtp_loss_scaling, cfg.rmsnorm, cfg.rope, cfg.swiglu, cfg.tied, cfg.bias);
    bool ok = write_bin(dir, "config.txt", txt, (size_t)len);
    len = 0;
    for (int i = 0; i < gpt_num_tensors(m) && len < (int)sizeof txt - 200; i++)
        len += snprintf(txt + len, sizeof txt - (size_t)len, "%s %zu %d %d\n", ts[i].name, ts[i].offset, ts[i].shape[0],
                        ts[i].ndim == 2 ? ts[i].shape[1] : 0);
    ok = ok && write_bin(dir, "tensors.txt", txt, (size_t)len);
    len = snprintf(txt, sizeof txt, "%.17g", main);
    for (int k = 0; k < cfg.mtp_layers; k++) len += snprintf(txt + len, sizeof txt - (size_t)len, " %.17g", dl[k]);
    ok = ok && write_bin(dir, "losses.txt", txt, (size_t)len);
    size_t nb = sizeof(int32_t) * (size_t)B * T;
    ok = ok && write_bin(dir, "params.bin", p, sizeof(float) * gpt_num_params(m)) &&
         write_bin(dir, "grads.bin", gpt_grads(m), sizeof(float) * gpt_num_params(m)) &&
         write_bin(dir, "tokens.bin", bb.tok, nb) && write_bin(dir, "targets.bin", bb.tgt, nb) &&
         write_bin(dir, "positions.bin", bb.pos, nb) && write_bin(dir, "mask.bin", bb.mask, sizeof(float) * B * T);
    gpt_destroy(&m);
    kb_backend_destroy(&be);
    return ok;
}

static void test_mtp_against_torch(void) {
    if (!g_python || !g_mtp_script) TEST_SKIP_CASE("no python and mtp_torch_ref.py given");
    char root[512];
    REQUIRE(t_scratch_dir(root, sizeof root, "cohort-mtp-ref") == 0);
    gpt_config c = tiny();
    c.mtp_layers = 2;
    c.mtp_loss_scaling = 0.3f;
    CHECK(dump_mtp_case(root, "gpt2_style_2_depths", c));
    c.rope = true;
    c.rmsnorm = true;
    c.swiglu = true;
    c.tied = false;
    c.bias = false;
    c.kv_groups = 2;
    c.mtp_layers = 1;
    c.mtp_loss_scaling = 1.0f;
    CHECK(dump_mtp_case(root, "llama_style_1_depth", c));
    char cmd[1200];
    snprintf(cmd, sizeof cmd, "'%s' '%s' --rm '%s'", g_python, g_mtp_script, root);
    int st = system(cmd);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        snprintf(cmd, sizeof cmd, "rm -rf '%s'", root);
        if (system(cmd)) fprintf(stderr, "could not remove %s\n", root);
        TEST_SKIP_CASE("python3-torch is not installed (deploy/setup.sh installs it)");
    }
    CHECK_MSG(st == 0, "mtp_torch_ref.py failed (status %d); the cases are kept in %s", st, root);
}

int main(int argc, char **argv) {
    if (argc >= 3) g_python = argv[1], g_mtp_script = argv[2];
    RUN(test_param_layout);
    RUN(test_grad_gpt2_style);
    RUN(test_grad_llama_style);
    RUN(test_grad_dropout_and_reset_mask);
    RUN(test_grad_moe);
    RUN(test_moe_one_expert_is_dense);
    RUN(test_grad_mtp);
    RUN(test_layernorm_1p);
    RUN(test_mtp_against_torch);
    RUN(test_bitwise_repeatable);
    RUN(test_learns_counting);
    RUN(test_learns_counting_bf16);
    return TEST_EXIT();
}
