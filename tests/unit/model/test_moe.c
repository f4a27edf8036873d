/* test_moe.c - the mixture-of-experts layer (model/moe.h): every configuration against the
 * numpy restatement of Megatron's router and MoE layer (tests/data/moe_ref.py: forward,
 * aux and z losses, routing map, drops, all gradients), gradients against finite
 * differences on tiny cases, bitwise determinism, configurations refused.
 *
 * usage: test_moe PYTHON MOE_REF_PY   (meson passes both; without them the numpy case skips) */
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/moe.h"
#include "tests/test.h"

#include <errno.h>
#include <stdint.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

static const char *g_python, *g_script, *g_torch_script;

static kb_backend *backend(void) {
    kb_backend *be = NULL;
    kb_options o = {.device = KB_DEVICE_CPU, .threads = 2};
    if (kb_backend_new(&be, &o)) return NULL;
    return be;
}

static moe_config base(void) {
    moe_config c = {.hidden = 16, .num_experts = 8, .ffn_hidden = 12, .topk = 2, .score = MOE_SCORE_SOFTMAX,
                    .lb = MOE_LB_AUX, .aux_coeff = 0.01f, .z_coeff = 0.0f, .drop = MOE_DROP_PROBS};
    return c;
}

/* One layer's inputs and outputs, host memory (the CPU backend's memory is host memory). */
typedef struct run {
    moe_layer *m;
    int N, h, E;
    size_t P;
    float *x, *params, *bias, *dy, *y, *dx, *dparams;
} run;

static void fill(float *p, size_t n, double std, co_rng *r) {
    for (size_t i = 0; i < n; i++) p[i] = (float)(std * co_rng_normal(r));
}

static void run_free(run *r) {
    moe_destroy(&r->m);
    free(r->x);
    free(r->params);
    free(r->bias);
    free(r->dy);
    free(r->y);
    free(r->dx);
    free(r->dparams);
    memset(r, 0, sizeof *r);
}

/* a layer with random inputs: x ~ N(0,1), router N(0, 0.5), experts N(0, 0.3), bias N(0, 0.1) */
static int run_new(run *r, const moe_config *c, kb_backend *be, int N, uint64_t seed) {
    memset(r, 0, sizeof *r);
    int rc = moe_new(&r->m, c, be, N);
    if (rc) return rc;
    const moe_offsets *off = moe_layer_offsets(r->m);
    r->N = N;
    r->h = c->hidden;
    r->E = c->num_experts;
    r->P = off->total;
    size_t Nh = (size_t)N * r->h;
    r->x = malloc(sizeof(float) * Nh);
    r->dy = malloc(sizeof(float) * Nh);
    r->y = malloc(sizeof(float) * Nh);
    r->dx = malloc(sizeof(float) * Nh);
    r->params = malloc(sizeof(float) * r->P);
    r->dparams = calloc(r->P, sizeof(float));
    r->bias = malloc(sizeof(float) * (size_t)r->E);
    if (!r->x || !r->dy || !r->y || !r->dx || !r->params || !r->dparams || !r->bias) return CO_ENOMEM;
    co_rng g;
    co_rng_seed(&g, seed);
    fill(r->x, Nh, 1.0, &g);
    fill(r->dy, Nh, 1.0, &g);
    fill(r->params, off->fc1, 0.5, &g);
    fill(r->params + off->fc1, r->P - off->fc1, 0.3, &g);
    fill(r->bias, (size_t)r->E, 0.1, &g);
    return 0;
}

static int fwd_bwd(run *r, int B, int T, float loss_scale) {
    int rc = moe_forward(r->m, r->y, r->x, r->params, r->bias, B, T);
    if (rc) return rc;
    memset(r->dparams, 0, sizeof(float) * r->P);
    return moe_backward(r->m, r->dx, r->dparams, r->dy, r->x, r->params, loss_scale);
}

/* --moe-grouped-gemm: the same layer with the experts as grouped products matches one
 * product per expert (different blocking: within 1e-5 relative to each tensor's largest
 * value), and is bitwise the same run twice. */
static void test_grouped_matches_sequential(void) {
    kb_backend *be = backend();
    REQUIRE(be);
    moe_config c = base();
    c.swiglu = true;
    c.shared_ffn = 8;
    c.capacity_factor = 1.25;
    int B = 2, T = 96, N = B * T;
    run seq, grp;
    REQUIRE(run_new(&seq, &c, be, N, 4242) == 0);
    c.grouped_gemm = true;
    REQUIRE(run_new(&grp, &c, be, N, 4242) == 0);
    REQUIRE(fwd_bwd(&seq, B, T, 1.0f) == 0 && fwd_bwd(&grp, B, T, 1.0f) == 0);
    size_t Nh = (size_t)N * c.hidden;
    double worst = 0;
    struct {
        const float *a, *b;
        size_t n;
    } t[] = {{seq.y, grp.y, Nh}, {seq.dx, grp.dx, Nh}, {seq.dparams, grp.dparams, seq.P}};
    for (int k = 0; k < 3; k++) {
        double mx = 1e-3, d = 0;
        for (size_t i = 0; i < t[k].n; i++) mx = fmax(mx, fabs(t[k].a[i]));
        for (size_t i = 0; i < t[k].n; i++) d = fmax(d, fabs((double)t[k].a[i] - t[k].b[i]));
        worst = fmax(worst, d / mx);
    }
    CHECK_MSG(worst <= 1e-5, "grouped vs per-expert products: relative difference %.3g", worst);
    float *y1 = malloc(sizeof(float) * Nh), *d1 = malloc(sizeof(float) * grp.P);
    memcpy(y1, grp.y, sizeof(float) * Nh);
    memcpy(d1, grp.dparams, sizeof(float) * grp.P);
    REQUIRE(fwd_bwd(&grp, B, T, 1.0f) == 0);
    CHECK(!memcmp(y1, grp.y, sizeof(float) * Nh) && !memcmp(d1, grp.dparams, sizeof(float) * grp.P));
    free(y1);
    free(d1);
    run_free(&seq);
    run_free(&grp);
    kb_backend_destroy(&be);
}

/* ---- against numpy ---- */

static bool write_file(const char *dir, const char *name, const void *p, size_t n) {
    char path[512];
    if (snprintf(path, sizeof path, "%s/%s", dir, name) >= (int)sizeof path) return false;
    FILE *f = fopen(path, "wb");
    if (!f) return false;
    bool ok = fwrite(p, 1, n, f) == n;
    return fclose(f) == 0 && ok;
}

typedef struct ref_case {
    const char *name;
    moe_config c;
    int B, T;
    float loss_scale;
    bool bf16; /* run on a --bf16 backend (moe_torch_ref.py's bf16 products) */
    bool eval; /* the forward outside training (sinkhorn routing chooses otherwise) */
} ref_case;

static bool dump_case(const char *root, int idx, const ref_case *rc, kb_backend *be) {
    char dir[512];
    if (snprintf(dir, sizeof dir, "%s/%02d-%s", root, idx, rc->name) >= (int)sizeof dir) return false;
    if (mkdir(dir, 0700) && errno != EEXIST) return false;
    run r;
    int N = rc->B * rc->T;
    if (run_new(&r, &rc->c, be, N, 1000 + (uint64_t)idx)) {
        fprintf(stderr, "  %s: %s\n", rc->name, co_err_detail());
        run_free(&r);
        return false;
    }
    moe_set_training(r.m, !rc->eval);
    int err = fwd_bwd(&r, rc->B, rc->T, rc->loss_scale);
    if (err) {
        fprintf(stderr, "  %s: %s\n", rc->name, co_err_detail());
        run_free(&r);
        return false;
    }
    const moe_config *c = &rc->c;
    char cfg[2048];
    int len = snprintf(cfg, sizeof cfg,
                       "hidden=%d\nnum_experts=%d\nffn_hidden=%d\ntopk=%d\nscore=%s\npre_softmax=%d\nnum_groups=%d\n"
                       "group_topk=%d\nscaling_factor=%.9g\nexpert_bias=%d\nlb=%s\naux_coeff=%.9g\nz_coeff=%.9g\n"
                       "capacity_factor=%.17g\ndrop=%s\npad_to_capacity=%d\nswiglu=%d\nshared_ffn=%d\nB=%d\nT=%d\n"
                       "loss_scale=%.9g\naux_loss=%.17g\nz_loss=%.17g\ndropped=%d\ncapacity=%d\nbf16=%d\ntrain=%d\n",
                       c->hidden, c->num_experts, c->ffn_hidden, c->topk,
                       c->score == MOE_SCORE_SOFTMAX ? "softmax" : "sigmoid", c->pre_softmax, c->num_groups,
                       c->group_topk, (double)c->scaling_factor, c->expert_bias,
                       c->lb == MOE_LB_NONE       ? "none"
                       : c->lb == MOE_LB_AUX      ? "aux_loss"
                       : c->lb == MOE_LB_SINKHORN ? "sinkhorn"
                                                  : "seq_aux_loss",
                       (double)c->aux_coeff, (double)c->z_coeff, c->capacity_factor,
                       c->drop == MOE_DROP_PROBS ? "probs" : "position", c->pad_to_capacity, c->swiglu, c->shared_ffn,
                       rc->B, rc->T, (double)rc->loss_scale, moe_aux_loss(r.m), moe_z_loss(r.m), moe_dropped(r.m),
                       moe_capacity(r.m), rc->bf16, !rc->eval);
    size_t Nh = sizeof(float) * (size_t)N * r.h, NE = (size_t)N * r.E;
    bool ok = write_file(dir, "config.txt", cfg, (size_t)len) && write_file(dir, "x.bin", r.x, Nh) &&
              write_file(dir, "params.bin", r.params, sizeof(float) * r.P) &&
              write_file(dir, "bias.bin", r.bias, sizeof(float) * (size_t)r.E) &&
              write_file(dir, "dy.bin", r.dy, Nh) && write_file(dir, "y.bin", r.y, Nh) &&
              write_file(dir, "dx.bin", r.dx, Nh) && write_file(dir, "dparams.bin", r.dparams, sizeof(float) * r.P) &&
              write_file(dir, "map.bin", moe_routing_map(r.m), NE) &&
              write_file(dir, "probs.bin", moe_routing_probs(r.m), sizeof(float) * NE) &&
              write_file(dir, "tpe.bin", moe_tokens_per_expert(r.m), sizeof(int32_t) * (size_t)r.E);
    run_free(&r);
    return ok;
}

/* Every configuration dumped, then checked by script (moe_ref.py: numpy; moe_torch_ref.py:
 * PyTorch autograd, exit 77 without torch). */
static void against(const char *script, bool with_bf16) {
    kb_backend *be = backend(), *b16 = NULL;
    REQUIRE(be);
    kb_options o16 = {.device = KB_DEVICE_CPU, .threads = 2, .bf16 = true};
    if (with_bf16 && kb_cpu_bf16_check(NULL, 0)) REQUIRE(kb_backend_new(&b16, &o16) == 0);
    ref_case cases[40];
    int n = 0;
    moe_config c;
#define ADD(nm, B_, T_, ls, ...)                                                           \
    do {                                                                                   \
        c = base();                                                                        \
        __VA_ARGS__;                                                                       \
        cases[n++] = (ref_case){.name = nm, .c = c, .B = B_, .T = T_, .loss_scale = ls};   \
    } while (0)
    ADD("softmax_k2_aux_z_gelu", 2, 12, 1.0f, c.z_coeff = 1e-2f);
    ADD("softmax_pre_k2_swiglu", 2, 12, 1.0f, c.pre_softmax = true, c.swiglu = true);
    ADD("softmax_k1_seqaux", 3, 8, 1.0f, c.topk = 1, c.lb = MOE_LB_SEQ_AUX, c.aux_coeff = 0.1f);
    ADD("softmax_k4_groups_aux_z", 2, 12, 1.0f, c.topk = 4, c.num_groups = 4, c.group_topk = 2, c.z_coeff = 1e-3f);
    ADD("softmax_pre_k2_groups_scale", 2, 12, 1.0f, c.pre_softmax = true, c.num_groups = 2, c.group_topk = 1,
        c.scaling_factor = 2.5f);
    ADD("sigmoid_k2_bias_aux", 2, 12, 1.0f, c.score = MOE_SCORE_SIGMOID, c.expert_bias = true);
    ADD("sigmoid_k1_bias_seqaux", 2, 12, 1.0f, c.score = MOE_SCORE_SIGMOID, c.expert_bias = true, c.topk = 1,
        c.lb = MOE_LB_SEQ_AUX, c.aux_coeff = 0.1f);
    ADD("sigmoid_k4_groups_bias_scale_z", 2, 12, 1.0f, c.score = MOE_SCORE_SIGMOID, c.expert_bias = true, c.topk = 4,
        c.num_groups = 4, c.group_topk = 2, c.scaling_factor = 2.5f, c.z_coeff = 1e-2f);
    ADD("sigmoid_k2_nobias_swiglu", 2, 12, 1.0f, c.score = MOE_SCORE_SIGMOID, c.swiglu = true);
    ADD("cap1.0_probs", 2, 12, 1.0f, c.capacity_factor = 1.0);
    ADD("cap0.5_position", 2, 12, 1.0f, c.capacity_factor = 0.5, c.drop = MOE_DROP_POSITION);
    ADD("cap1.5_probs_pad", 2, 12, 1.0f, c.capacity_factor = 1.5, c.pad_to_capacity = true);
    ADD("sigmoid_cap0.75_position_pad_swiglu", 2, 12, 1.0f, c.score = MOE_SCORE_SIGMOID, c.capacity_factor = 0.75,
        c.drop = MOE_DROP_POSITION, c.pad_to_capacity = true, c.swiglu = true, c.z_coeff = 1e-2f);
    ADD("shared_gelu_lossscale", 2, 12, 0.5f, c.shared_ffn = 20, c.z_coeff = 0.1f, c.aux_coeff = 0.1f);
    ADD("sigmoid_k4_shared_swiglu_cap_seqaux", 2, 12, 1.0f, c.score = MOE_SCORE_SIGMOID, c.topk = 4,
        c.shared_ffn = 10, c.swiglu = true, c.capacity_factor = 1.0, c.lb = MOE_LB_SEQ_AUX, c.aux_coeff = 0.1f,
        c.z_coeff = 1e-2f, c.scaling_factor = 1.5f);
    ADD("pre_groups_cap_position", 2, 12, 1.0f, c.pre_softmax = true, c.num_groups = 4, c.group_topk = 2,
        c.capacity_factor = 0.8, c.drop = MOE_DROP_POSITION);
    ADD("none_z_only", 2, 12, 1.0f, c.lb = MOE_LB_NONE, c.z_coeff = 0.1f);
    ADD("all_experts_k8", 1, 16, 1.0f, c.topk = 8, c.swiglu = true);
    ADD("one_expert", 2, 5, 1.0f, c.num_experts = 1, c.topk = 1, c.shared_ffn = 4);
    ADD("cap_tiny_pad_probs", 2, 12, 1.0f, c.capacity_factor = 0.1, c.pad_to_capacity = true, c.topk = 1);
    /* the experts as grouped products (--moe-grouped-gemm) */
    ADD("grouped_k2_swiglu_shared_z", 2, 16, 1.0f, c.grouped_gemm = true, c.swiglu = true, c.shared_ffn = 10,
        c.z_coeff = 1e-2f);
    ADD("grouped_sigmoid_k4_bias_cap_pad", 2, 16, 1.0f, c.grouped_gemm = true, c.score = MOE_SCORE_SIGMOID,
        c.expert_bias = true, c.topk = 4, c.capacity_factor = 0.75, c.pad_to_capacity = true);
    ADD("grouped_k8_gelu", 1, 24, 1.0f, c.grouped_gemm = true, c.topk = 8);
    /* Megatron's sinkhorn routing (no aux loss): softmax at top-k > 1, sigmoid at top-1 */
    ADD("sinkhorn_k2_z", 2, 12, 1.0f, c.lb = MOE_LB_SINKHORN, c.aux_coeff = 0, c.z_coeff = 1e-2f);
    ADD("sinkhorn_k1_swiglu_cap", 2, 12, 1.0f, c.lb = MOE_LB_SINKHORN, c.aux_coeff = 0, c.topk = 1, c.swiglu = true,
        c.capacity_factor = 1.0);
    ADD("sinkhorn_k4_shared_grouped", 2, 16, 1.0f, c.lb = MOE_LB_SINKHORN, c.aux_coeff = 0, c.topk = 4,
        c.shared_ffn = 10, c.grouped_gemm = true);
    ADD("sinkhorn_k2_eval", 2, 12, 1.0f, c.lb = MOE_LB_SINKHORN, c.aux_coeff = 0);
    cases[n - 1].eval = true;
    /* --bf16 (the torch script only; where the CPU has bf16 matrix instructions) */
    int nf = n;
    if (b16) {
        ADD("bf16_k2_swiglu_shared_aux_z", 2, 16, 1.0f, c.swiglu = true, c.shared_ffn = 10, c.z_coeff = 1e-2f);
        ADD("bf16_grouped_sigmoid_k4_bias_cap", 2, 16, 1.0f, c.grouped_gemm = true, c.score = MOE_SCORE_SIGMOID,
            c.expert_bias = true, c.topk = 4, c.capacity_factor = 0.75);
        ADD("bf16_cap0.5_position_gelu", 2, 12, 1.0f, c.capacity_factor = 0.5, c.drop = MOE_DROP_POSITION);
        for (int i = nf; i < n; i++) cases[i].bf16 = true;
    }
#undef ADD
    char root[512];
    REQUIRE(t_scratch_dir(root, sizeof root, "cohort-moe-ref") == 0);
    for (int i = 0; i < n; i++)
        CHECK_MSG(dump_case(root, i, &cases[i], cases[i].bf16 ? b16 : be), "case %s", cases[i].name);
    char cmd[1024];
    REQUIRE(snprintf(cmd, sizeof cmd, "'%s' '%s' --rm '%s'", g_python, script, root) < (int)sizeof cmd);
    int st = system(cmd);
    kb_backend_destroy(&be);
    kb_backend_destroy(&b16);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) {
        char rm[600];
        snprintf(rm, sizeof rm, "rm -rf '%s'", root);
        if (system(rm)) fprintf(stderr, "could not remove %s\n", root);
        TEST_SKIP_CASE("python3-torch is not installed (deploy/setup.sh installs it)");
    }
    CHECK_MSG(st == 0, "%s failed (status %d); inputs and outputs kept in %s", script, st, root);
}

static void test_against_numpy(void) {
    if (!g_python || !g_script) TEST_SKIP_CASE("no python and moe_ref.py given");
    against(g_script, false);
}

static void test_against_torch(void) {
    if (!g_python || !g_torch_script) TEST_SKIP_CASE("no python and moe_torch_ref.py given");
    against(g_torch_script, true);
}

/* ---- finite differences ---- */

/* loss = sum y . w + aux + z, in double */
static double loss_of(run *r, int B, int T, const float *w, uint8_t *map_out) {
    if (moe_forward(r->m, r->y, r->x, r->params, r->bias, B, T)) return NAN;
    double s = 0;
    for (int i = 0; i < r->N * r->h; i++) s += (double)r->y[i] * w[i];
    if (map_out) memcpy(map_out, moe_routing_map(r->m), (size_t)r->N * r->E);
    return s + moe_aux_loss(r->m) + moe_z_loss(r->m);
}

static void grad_check(moe_config c, int B, int T, const char *label) {
    kb_backend *be = backend();
    REQUIRE(be);
    run r;
    int N = B * T;
    REQUIRE_MSG(run_new(&r, &c, be, N, 77) == 0, "%s", co_err_detail());
    REQUIRE(fwd_bwd(&r, B, T, 1.0f) == 0);
    size_t NE = (size_t)N * r.E, Nh = (size_t)N * r.h;
    uint8_t *map0 = malloc(NE), *map1 = malloc(NE);
    float *gx = malloc(sizeof(float) * Nh);
    REQUIRE(map0 && map1 && gx);
    memcpy(map0, moe_routing_map(r.m), NE);
    memcpy(gx, r.dx, sizeof(float) * Nh);
    int bad = 0, checked = 0, skipped = 0;
    double worst = 0;
    /* every parameter and every input entry */
    for (int which = 0; which < 2; which++) {
        float *v = which ? r.x : r.params;
        const float *g = which ? gx : r.dparams;
        size_t n = which ? Nh : r.P;
        for (size_t k = 0; k < n; k++) {
            float save = v[k];
            double d[2];
            bool same = true;
            for (int j = 0; j < 2 && same; j++) {
                float hs = j ? 5e-3f : 1e-2f;
                v[k] = save + hs;
                double lp = loss_of(&r, B, T, r.dy, map1);
                same &= memcmp(map0, map1, NE) == 0;
                v[k] = save - hs;
                double lm = loss_of(&r, B, T, r.dy, map1);
                same &= memcmp(map0, map1, NE) == 0;
                v[k] = save;
                d[j] = (lp - lm) / (2.0 * hs);
            }
            if (!same) {
                skipped++; /* the step crossed a routing decision */
                continue;
            }
            double fd = (4.0 * d[1] - d[0]) / 3.0, err = fabs(fd - g[k]);
            checked++;
            if (err > 2e-4 + 1e-2 * fabs(fd)) {
                if (bad < 5) fprintf(stderr, "  %s: %s[%zu] fd %.6g analytic %.6g\n", label, which ? "x" : "param", k, fd, g[k]);
                bad++;
            }
            if (err > worst) worst = err;
        }
    }
    fprintf(stderr, "  %s: %d entries checked, %d skipped (routing changed), worst |fd - analytic| %.3g\n", label,
            checked, skipped, worst);
    CHECK_MSG(bad == 0, "%s: %d of %d gradient entries disagree with finite differences", label, bad, checked);
    CHECK(skipped * 10 < checked);
    free(map0);
    free(map1);
    free(gx);
    run_free(&r);
    kb_backend_destroy(&be);
}

static moe_config tiny(void) {
    moe_config c = {.hidden = 6, .num_experts = 4, .ffn_hidden = 5, .topk = 2, .score = MOE_SCORE_SOFTMAX,
                    .lb = MOE_LB_AUX, .aux_coeff = 0.5f, .z_coeff = 0.05f};
    return c;
}

static void test_grad_softmax(void) {
    moe_config c = tiny();
    c.swiglu = true;
    c.shared_ffn = 3;
    grad_check(c, 2, 3, "softmax/swiglu/shared/aux/z");
}

static void test_grad_softmax_pre_seq(void) {
    moe_config c = tiny();
    c.pre_softmax = true;
    c.lb = MOE_LB_SEQ_AUX;
    c.scaling_factor = 2.0f;
    grad_check(c, 2, 3, "softmax pre/seq_aux/scaling/gelu");
}

static void test_grad_sigmoid(void) {
    moe_config c = tiny();
    c.score = MOE_SCORE_SIGMOID;
    c.expert_bias = true;
    c.num_groups = 2;
    c.group_topk = 1;
    c.capacity_factor = 0.75;
    c.lb = MOE_LB_SEQ_AUX;
    grad_check(c, 2, 3, "sigmoid/bias/groups/capacity/seq_aux");
}

static void test_grad_sigmoid_k1_pad(void) {
    moe_config c = tiny();
    c.score = MOE_SCORE_SIGMOID;
    c.topk = 1;
    c.capacity_factor = 1.0;
    c.pad_to_capacity = true;
    c.drop = MOE_DROP_POSITION;
    c.shared_ffn = 2;
    grad_check(c, 2, 3, "sigmoid k1/pad/position/shared");
}

/* ---- padding rows (moe_set_padding: context parallelism's THD split) ---- */

/* close within 1e-5 relative to the larger value (products over other row counts) */
static bool near(double a, double b) { return fabs(a - b) <= 1e-5 * (1.0 + fmax(fabs(a), fabs(b))); }

/* One configuration: B sequences of Tr real rows against the same rows with padding rows
 * between them (Tp rows per sequence): the real rows' outputs, input gradients and routing,
 * the parameter gradients, the aux and z losses, the tokens per expert, the drops and the
 * capacity are the unpadded layer's; padding rows' outputs and input gradients are 0. */
static void padding_case(moe_config c, const char *label) {
    kb_backend *be = backend();
    REQUIRE(be);
    const int B = 2, Tr = 12, Tp = 16, Nr = B * Tr, Np = B * Tp, h = c.hidden, E = c.num_experts;
    run u, p;
    REQUIRE_MSG(run_new(&u, &c, be, Nr, 31) == 0, "%s: %s", label, co_err_detail());
    REQUIRE_MSG(run_new(&p, &c, be, Np, 32) == 0, "%s: %s", label, co_err_detail());
    memcpy(p.params, u.params, sizeof(float) * u.P);
    memcpy(p.bias, u.bias, sizeof(float) * (size_t)E);
    /* padded row i of sequence b: a real row, or padding (ids -1) at 3, 7, 14 and 15, whose
     * inputs are large (they would win every top-k and capacity) and whose output gradient
     * is 0 (padding carries no loss) */
    int32_t ids[Np], real_of[Np];
    for (int b = 0, n = 0; b < B; b++)
        for (int i = 0; i < Tp; i++) {
            int r = b * Tp + i;
            bool pad = i == 3 || i == 7 || i >= 14;
            ids[r] = pad ? -1 : r;
            real_of[r] = pad ? -1 : n++;
            if (pad) {
                for (int q = 0; q < h; q++) p.x[(size_t)r * h + q] = 8.0f * (float)(q % 3 + 1);
                memset(p.dy + (size_t)r * h, 0, sizeof(float) * (size_t)h);
            } else {
                memcpy(p.x + (size_t)r * h, u.x + (size_t)real_of[r] * h, sizeof(float) * (size_t)h);
                memcpy(p.dy + (size_t)r * h, u.dy + (size_t)real_of[r] * h, sizeof(float) * (size_t)h);
            }
        }
    moe_set_padding(p.m, ids);
    if (c.lb == MOE_LB_GLOBAL_AUX) moe_global_aux_reset(u.m), moe_global_aux_reset(p.m);
    REQUIRE_MSG(fwd_bwd(&u, B, Tr, 1.0f) == 0, "%s: %s", label, co_err_detail());
    REQUIRE_MSG(fwd_bwd(&p, B, Tp, 1.0f) == 0, "%s: %s", label, co_err_detail());
    CHECK_MSG(near(moe_aux_loss(u.m), moe_aux_loss(p.m)), "%s: aux %.9g vs %.9g", label, moe_aux_loss(p.m),
              moe_aux_loss(u.m));
    CHECK_MSG(near(moe_z_loss(u.m), moe_z_loss(p.m)), "%s: z %.9g vs %.9g", label, moe_z_loss(p.m),
              moe_z_loss(u.m));
    CHECK_MSG(c.lb == MOE_LB_NONE || c.lb == MOE_LB_SINKHORN || moe_aux_loss(u.m) > 0, "%s: no aux loss", label);
    CHECK_MSG(moe_capacity(u.m) == moe_capacity(p.m), "%s: capacity %d vs %d", label, moe_capacity(p.m),
              moe_capacity(u.m));
    CHECK_MSG(moe_dropped(u.m) == moe_dropped(p.m), "%s: dropped %d vs %d", label, moe_dropped(p.m),
              moe_dropped(u.m));
    CHECK_MSG(memcmp(moe_tokens_per_expert(u.m), moe_tokens_per_expert(p.m), sizeof(int32_t) * (size_t)E) == 0,
              "%s: tokens per expert differ", label);
    int bad_map = 0, bad_y = 0, bad_dx = 0, bad_dp = 0;
    const uint8_t *mu = moe_routing_map(u.m), *mp = moe_routing_map(p.m);
    for (int r = 0; r < Np; r++) {
        int n = real_of[r];
        for (int e = 0; e < E; e++)
            bad_map += mp[(size_t)r * E + e] != (n < 0 ? 0 : mu[(size_t)n * E + e]);
        for (int q = 0; q < h; q++) {
            float y = p.y[(size_t)r * h + q], dx = p.dx[(size_t)r * h + q];
            bad_y += n < 0 ? (c.shared_ffn == 0 && y != 0.0f) : !near(y, u.y[(size_t)n * h + q]);
            bad_dx += n < 0 ? (c.shared_ffn == 0 && dx != 0.0f) : !near(dx, u.dx[(size_t)n * h + q]);
        }
    }
    for (size_t i = 0; i < u.P; i++) bad_dp += !near(u.dparams[i], p.dparams[i]);
    CHECK_MSG(bad_map == 0, "%s: %d routing map entries differ", label, bad_map);
    CHECK_MSG(bad_y == 0, "%s: %d output entries differ", label, bad_y);
    CHECK_MSG(bad_dx == 0, "%s: %d input gradient entries differ", label, bad_dx);
    CHECK_MSG(bad_dp == 0, "%s: %d parameter gradient entries differ", label, bad_dp);
    /* the mask matters: the same padded rows without it route the padding and change the losses */
    moe_set_padding(p.m, NULL);
    REQUIRE(fwd_bwd(&p, B, Tp, 1.0f) == 0);
    CHECK_MSG(c.lb == MOE_LB_NONE || c.lb == MOE_LB_SINKHORN || !near(moe_aux_loss(u.m), moe_aux_loss(p.m)),
              "%s: the aux loss does not see the padding", label);
    run_free(&u);
    run_free(&p);
    kb_backend_destroy(&be);
}

static void test_padding_matches_unpadded(void) {
    moe_config c = base();
    c.z_coeff = 1e-2f;
    padding_case(c, "softmax/aux/z");
    c.lb = MOE_LB_SEQ_AUX;
    c.swiglu = true;
    padding_case(c, "softmax/seq_aux/z/swiglu");
    c.shared_ffn = 6; /* (the shared expert runs on padding rows too: only real rows compared) */
    c.pre_softmax = true;
    padding_case(c, "softmax pre/seq_aux/shared");
    c = base();
    c.score = MOE_SCORE_SIGMOID;
    c.expert_bias = true;
    c.num_groups = 4;
    c.group_topk = 2;
    c.lb = MOE_LB_SEQ_AUX;
    c.z_coeff = 1e-2f;
    padding_case(c, "sigmoid/bias/groups/seq_aux");
    c.capacity_factor = 0.75; /* tokens dropped: the capacity of the real rows, only they candidates */
    padding_case(c, "sigmoid/capacity 0.75/probs");
    c = base();
    c.capacity_factor = 1.0;
    c.drop = MOE_DROP_POSITION;
    c.pad_to_capacity = true;
    padding_case(c, "softmax/capacity 1/position/pad");
    c = base();
    c.lb = MOE_LB_GLOBAL_AUX;
    padding_case(c, "global_aux");
    c = base();
    c.lb = MOE_LB_SINKHORN;
    c.aux_coeff = 0;
    padding_case(c, "sinkhorn");
}

/* ---- determinism ---- */

static void test_deterministic(void) {
    kb_backend *be = backend();
    REQUIRE(be);
    moe_config c = base();
    c.score = MOE_SCORE_SIGMOID;
    c.expert_bias = true;
    c.topk = 4;
    c.num_groups = 4;
    c.group_topk = 2;
    c.shared_ffn = 24;
    c.swiglu = true;
    c.capacity_factor = 1.25;
    c.z_coeff = 1e-2f;
    c.hidden = 64;
    c.ffn_hidden = 48;
    int B = 4, T = 32, N = B * T;
    run a, b;
    REQUIRE(run_new(&a, &c, be, N, 5) == 0);
    REQUIRE(run_new(&b, &c, be, N, 5) == 0);
    REQUIRE(fwd_bwd(&a, B, T, 1.0f) == 0);
    size_t Nh = sizeof(float) * (size_t)N * c.hidden;
    float *y0 = malloc(Nh), *dx0 = malloc(Nh), *dp0 = malloc(sizeof(float) * a.P);
    REQUIRE(y0 && dx0 && dp0);
    memcpy(y0, a.y, Nh);
    memcpy(dx0, a.dx, Nh);
    memcpy(dp0, a.dparams, sizeof(float) * a.P);
    double aux0 = moe_aux_loss(a.m), z0 = moe_z_loss(a.m);
    /* the same layer again, and a second layer */
    REQUIRE(fwd_bwd(&a, B, T, 1.0f) == 0);
    REQUIRE(fwd_bwd(&b, B, T, 1.0f) == 0);
    run *rs[2] = {&a, &b};
    for (int i = 0; i < 2; i++) {
        CHECK(memcmp(y0, rs[i]->y, Nh) == 0);
        CHECK(memcmp(dx0, rs[i]->dx, Nh) == 0);
        CHECK(memcmp(dp0, rs[i]->dparams, sizeof(float) * a.P) == 0);
        CHECK(moe_aux_loss(rs[i]->m) == aux0 && moe_z_loss(rs[i]->m) == z0);
    }
    /* backward accumulates into the parameter gradient */
    REQUIRE(moe_forward(a.m, a.y, a.x, a.params, a.bias, B, T) == 0);
    REQUIRE(moe_backward(a.m, a.dx, a.dparams, a.dy, a.x, a.params, 1.0f) == 0);
    /* (not bitwise: a product accumulated into dW sums in its own order) */
    int off = 0;
    for (size_t i = 0; i < a.P; i++) off += !(fabsf(a.dparams[i] - 2.0f * dp0[i]) <= 1e-5f * (1.0f + fabsf(dp0[i])));
    CHECK_MSG(off == 0, "%d gradient entries are not twice the first", off);
    free(y0);
    free(dx0);
    free(dp0);
    run_free(&a);
    run_free(&b);
    kb_backend_destroy(&be);
}

/* ---- shapes and non-finite inputs ---- */

/* A layer sized for more tokens gives the same bits on fewer as one sized exactly; a NaN
 * in the input comes out as NaN (routing still picks valid experts), never a crash. */
static void test_smaller_batch_and_nan(void) {
    kb_backend *be = backend();
    REQUIRE(be);
    moe_config c = base();
    c.capacity_factor = 1.0;
    c.pad_to_capacity = true;
    c.shared_ffn = 8;
    c.z_coeff = 1e-2f;
    run big, small;
    REQUIRE(run_new(&big, &c, be, 64, 9) == 0);
    REQUIRE(run_new(&small, &c, be, 24, 9) == 0);
    /* the same first 24 tokens and parameters */
    memcpy(big.x, small.x, sizeof(float) * 24 * c.hidden);
    memcpy(big.dy, small.dy, sizeof(float) * 24 * c.hidden);
    memcpy(big.params, small.params, sizeof(float) * small.P);
    memcpy(big.bias, small.bias, sizeof(float) * (size_t)c.num_experts);
    REQUIRE(fwd_bwd(&big, 2, 12, 1.0f) == 0);
    REQUIRE(fwd_bwd(&small, 2, 12, 1.0f) == 0);
    CHECK(memcmp(big.y, small.y, sizeof(float) * 24 * c.hidden) == 0);
    CHECK(memcmp(big.dx, small.dx, sizeof(float) * 24 * c.hidden) == 0);
    CHECK(memcmp(big.dparams, small.dparams, sizeof(float) * small.P) == 0);
    CHECK(moe_capacity(big.m) == 6 && moe_capacity(small.m) == 6);
    /* NaN in one token */
    small.x[5 * c.hidden + 3] = NAN;
    REQUIRE(fwd_bwd(&small, 2, 12, 1.0f) == 0);
    CHECK(isnan(small.y[5 * c.hidden]));
    CHECK(isnan(moe_z_loss(small.m)));
    int routed = 0;
    for (int e = 0; e < c.num_experts; e++) routed += moe_tokens_per_expert(small.m)[e];
    CHECK(routed == c.num_experts * 6);
    run_free(&big);
    run_free(&small);
    kb_backend_destroy(&be);
}

/* ---- the expert bias balances the load (aux-loss-free balancing) ---- */

/* A router that sends almost every token to experts 0 and 1; Megatron's bias update after each
 * forward (moe_expert_bias_update) spreads the load until no expert holds more than twice
 * the mean, while the routing probabilities stay the unbiased sigmoid scores. */
static void test_expert_bias_balances(void) {
    kb_backend *be = backend();
    REQUIRE(be);
    moe_config c = base();
    c.score = MOE_SCORE_SIGMOID;
    c.expert_bias = true;
    c.lb = MOE_LB_NONE;
    int B = 4, T = 64, N = B * T, E = c.num_experts, h = c.hidden;
    run r;
    REQUIRE(run_new(&r, &c, be, N, 21) == 0);
    for (int n = 0; n < N; n++) r.x[(size_t)n * h] = 3.0f + 0.1f * r.x[(size_t)n * h];
    for (int e = 0; e < E; e++) r.params[(size_t)e * h] = e < 2 ? 1.0f : -1.0f;
    memset(r.bias, 0, sizeof(float) * (size_t)E);
    int first = 0, last = 0;
    for (int it = 0; it < 200; it++) {
        REQUIRE(moe_forward(r.m, r.y, r.x, r.params, r.bias, B, T) == 0);
        const int32_t *tpe = moe_tokens_per_expert(r.m);
        int mx = 0;
        for (int e = 0; e < E; e++) mx = tpe[e] > mx ? tpe[e] : mx;
        if (it == 0) first = mx;
        last = mx;
        moe_expert_bias_update(r.bias, tpe, E, 0.02f);
    }
    int mean = N * c.topk / E;
    fprintf(stderr, "  busiest expert: %d tokens before, %d after 200 bias updates (mean %d)\n", first, last, mean);
    CHECK(first > 3 * mean);
    CHECK(last <= 2 * mean);
    /* the probabilities are the unbiased scores: sigmoid of the logits, normalised over the 2 */
    const float *p = moe_routing_probs(r.m);
    double s = 0;
    for (int e = 0; e < E; e++) s += p[e];
    CHECK(fabs(s - 1.0) < 1e-6);
    run_free(&r);
    kb_backend_destroy(&be);
}

/* ---- errors ---- */

/* --bf16: the router's product stays fp32 (Megatron's --moe-router-dtype fp32), so the
 * routing (probabilities, map, aux loss) is bitwise the fp32 layer's, while the experts'
 * products are bf16 (the output differs); the grouped products are bitwise the products one
 * by one. Skipped where the CPU has no bf16 matrix instructions. */
static void test_bf16_router_fp32(void) {
    if (!kb_cpu_bf16_check(NULL, 0)) return;
    kb_backend *be = backend(), *b16 = NULL;
    kb_options o = {.device = KB_DEVICE_CPU, .threads = 2, .bf16 = true};
    REQUIRE(be && kb_backend_new(&b16, &o) == 0);
    moe_config c = base();
    c.shared_ffn = 8;
    int B = 2, T = 48, N = B * T;
    run f, h, g;
    REQUIRE(run_new(&f, &c, be, N, 77) == 0 && run_new(&h, &c, b16, N, 77) == 0);
    c.grouped_gemm = true;
    REQUIRE(run_new(&g, &c, b16, N, 77) == 0);
    REQUIRE(fwd_bwd(&f, B, T, 1.0f) == 0 && fwd_bwd(&h, B, T, 1.0f) == 0 && fwd_bwd(&g, B, T, 1.0f) == 0);
    size_t NE = (size_t)N * c.num_experts, Nh = (size_t)N * c.hidden;
    CHECK(!memcmp(moe_routing_probs(f.m), moe_routing_probs(h.m), NE * sizeof(float)));
    CHECK(!memcmp(moe_routing_map(f.m), moe_routing_map(h.m), NE));
    CHECK(moe_aux_loss(f.m) == moe_aux_loss(h.m));
    CHECK(memcmp(f.y, h.y, Nh * sizeof(float)) != 0); /* the experts' products in bf16 */
    double d = 0, mx = 1e-3;
    for (size_t i = 0; i < Nh; i++) d = fmax(d, fabs((double)f.y[i] - h.y[i])), mx = fmax(mx, fabs(f.y[i]));
    CHECK_MSG(d / mx < 2e-2, "bf16 vs fp32 output: relative difference %.3g", d / mx);
    CHECK(!memcmp(g.y, h.y, Nh * sizeof(float)) && !memcmp(g.dx, h.dx, Nh * sizeof(float)) &&
          !memcmp(g.dparams, h.dparams, h.P * sizeof(float)));
    run_free(&f);
    run_free(&h);
    run_free(&g);
    kb_backend_destroy(&be);
    kb_backend_destroy(&b16);
}

static void test_refused(void) {
    moe_offsets off;
    moe_config c = base();
    CHECK(moe_layout(&c, &off) == 0);
    c.topk = 9;
    CHECK(moe_layout(&c, &off) == CO_EINVAL);
    c = base();
    c.expert_bias = true; /* softmax */
    CHECK(moe_layout(&c, &off) == CO_EINVAL);
    CHECK(strstr(co_err_detail(), "sigmoid") != NULL);
    c = base();
    c.num_groups = 3;
    c.group_topk = 1;
    CHECK(moe_layout(&c, &off) == CO_EINVAL);
    c.num_groups = 4;
    c.group_topk = 5;
    CHECK(moe_layout(&c, &off) == CO_EINVAL);
    c = base();
    c.topk = 4;
    c.num_groups = 8;
    c.group_topk = 1; /* 4 experts out of one group of 1 */
    CHECK(moe_layout(&c, &off) == CO_EINVAL);
    c = base();
    c.pad_to_capacity = true;
    CHECK(moe_layout(&c, &off) == CO_EINVAL);
    c = base();
    c.pre_softmax = true;
    c.score = MOE_SCORE_SIGMOID;
    CHECK(moe_layout(&c, &off) == CO_EINVAL);
    kb_backend *be = backend();
    REQUIRE(be);
    run r;
    c = base();
    REQUIRE(run_new(&r, &c, be, 8, 1) == 0);
    CHECK(moe_backward(r.m, r.dx, r.dparams, r.dy, r.x, r.params, 1.0f) == CO_EINVAL);
    CHECK(moe_forward(r.m, r.y, r.x, r.params, NULL, 3, 3) == CO_EINVAL);
    CHECK(strstr(co_err_detail(), "moe_forward") != NULL);
    CHECK(moe_forward(r.m, r.y, r.x, r.params, NULL, 2, 4) == 0);
    /* the expert bias update: under-loaded experts go up */
    float bias[4] = {0, 0, 0, 0};
    int32_t tpe[4] = {1, 5, 3, 3};
    moe_expert_bias_update(bias, tpe, 4, 1e-3f);
    CHECK(bias[0] == 1e-3f && bias[1] == -1e-3f && bias[2] == 0.0f && bias[3] == 0.0f);
    run_free(&r);
    kb_backend_destroy(&be);
}

int main(int argc, char **argv) {
    if (argc >= 3) g_python = argv[1], g_script = argv[2];
    if (argc >= 4) g_torch_script = argv[3];
    RUN(test_refused);
    RUN(test_deterministic);
    RUN(test_grouped_matches_sequential);
    RUN(test_bf16_router_fp32);
    RUN(test_smaller_batch_and_nan);
    RUN(test_expert_bias_balances);
    RUN(test_grad_softmax);
    RUN(test_grad_softmax_pre_seq);
    RUN(test_grad_sigmoid);
    RUN(test_grad_sigmoid_k1_pad);
    RUN(test_padding_matches_unpadded);
    RUN(test_against_numpy);
    RUN(test_against_torch);
    return TEST_EXIT();
}
