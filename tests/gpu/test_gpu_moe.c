/* test_gpu_moe.c - the MoE layer (model/moe.h) on the CUDA backend against the CPU backend:
 * the same inputs and weights through both, per configuration:
 *   - the routing map, tokens per expert and drops identical;
 *   - y and dx within 1e-4 max|ref| + 1e-3 |ref|, every parameter's gradient within
 *     2e-4 max|g| + 1e-3 |g| (what tests/gpu/test_gpu_model.c allows between the backends);
 *   - the aux and z losses within 1e-4 relative;
 *   - two GPU runs bitwise equal.
 * With grouped_gemm (--moe-grouped-gemm: the experts through kb_ops.grouped_linear_*, on CUDA
 * cuBLAS's grouped GEMM, kernels/cuda/cuda_grouped.cu) the CPU side uses its grouped products
 * too, and a third side, the CUDA backend with one product per expert, must agree with the
 * grouped CUDA side within the same tolerances; those configurations route uneven groups with
 * an empty one (an expert bias of -50 that top-k never picks: asserted).
 * Routing runs on the host over the backend's managed memory, the products on the GPU.
 * Exits 77 without a GPU. */
#include "model/moe.h"
#include "tests/gpu/gpu_util.h"

#include <dlfcn.h>
#include <math.h>

typedef struct side {
    kb_backend *be;
    moe_layer *m;
    float *x, *params, *dy, *y, *dx, *dparams;
} side;

typedef struct host_out {
    float *y, *dx, *dparams;
    uint8_t *map;
    int32_t *tpe;
    double aux, z;
    int dropped;
} host_out;

static void run_side(side *s, const moe_config *c, int B, int T, const float *bias, host_out *o) {
    const kb_ops *op = s->be->ops;
    int N = B * T, E = c->num_experts;
    size_t Nh = (size_t)N * c->hidden, P = moe_layer_offsets(s->m)->total;
    op->zero(s->be, s->dparams, P);
    REQUIRE_MSG(moe_forward(s->m, s->y, s->x, s->params, bias, B, T) == 0, "%s", co_err_detail());
    REQUIRE_MSG(moe_backward(s->m, s->dx, s->dparams, s->dy, s->x, s->params, 1.0f) == 0, "%s", co_err_detail());
    op->copy(s->be, o->y, s->y, sizeof(float) * Nh);
    op->copy(s->be, o->dx, s->dx, sizeof(float) * Nh);
    op->copy(s->be, o->dparams, s->dparams, sizeof(float) * P);
    memcpy(o->map, moe_routing_map(s->m), (size_t)N * E);
    memcpy(o->tpe, moe_tokens_per_expert(s->m), sizeof(int32_t) * (size_t)E);
    o->aux = moe_aux_loss(s->m);
    o->z = moe_z_loss(s->m);
    o->dropped = moe_dropped(s->m);
}

static double worst_ratio(const float *a, const float *ref, size_t n, double atol_rel, double rtol) {
    double mx = 0, w = 0;
    for (size_t i = 0; i < n; i++) mx = fmax(mx, fabs(ref[i]));
    for (size_t i = 0; i < n; i++) {
        double tol = atol_rel * mx + rtol * fabs(ref[i]) + 1e-30;
        double r = fabs((double)a[i] - ref[i]) / tol;
        if (!(r <= w)) w = isnan(r) ? INFINITY : r;
    }
    return w;
}

static bool alloc_out(host_out *o, size_t Nh, size_t P, size_t NE, int E) {
    o->y = malloc(sizeof(float) * Nh);
    o->dx = malloc(sizeof(float) * Nh);
    o->dparams = malloc(sizeof(float) * P);
    o->map = malloc(NE);
    o->tpe = malloc(sizeof(int32_t) * (size_t)E);
    return o->y && o->dx && o->dparams && o->map && o->tpe;
}

static void free_out(host_out *o) {
    free(o->y);
    free(o->dx);
    free(o->dparams);
    free(o->map);
    free(o->tpe);
}

/* empty >= 0: that expert gets an expert bias of -50 (sigmoid scores with the bias: never
 * selected), so its group has no rows */
static void check_config(const char *name, moe_config c, kb_backend *cpu, kb_backend *gpu, int empty) {
    int B = 2, T = 32, N = B * T, E = c.num_experts;
    moe_offsets off;
    REQUIRE(moe_layout(&c, &off) == 0);
    size_t Nh = (size_t)N * c.hidden, P = off.total, NE = (size_t)N * E;
    float *x = malloc(sizeof(float) * Nh), *dy = malloc(sizeof(float) * Nh), *params = malloc(sizeof(float) * P);
    float bias[64];
    REQUIRE(x && dy && params && E <= 64);
    for (size_t i = 0; i < Nh; i++) x[i] = gu_uniform(), dy[i] = gu_uniform();
    for (size_t i = 0; i < P; i++) params[i] = 0.3f * gu_uniform();
    for (int e = 0; e < E; e++) bias[e] = 0.05f * gu_uniform();
    if (empty >= 0) {
        REQUIRE(c.expert_bias && c.score == MOE_SCORE_SIGMOID && empty < E);
        bias[empty] = -50.0f;
    }
    /* sides: CPU, CUDA, and with grouped_gemm the CUDA backend with one product per expert */
    int nsides = c.grouped_gemm ? 3 : 2;
    side sd[3] = {{.be = cpu}, {.be = gpu}, {.be = gpu}};
    host_out out[4];
    for (int k = 0; k < 4; k++) REQUIRE(alloc_out(&out[k], Nh, P, NE, E));
    for (int k = 0; k < nsides; k++) {
        side *s = &sd[k];
        moe_config ck = c;
        if (k == 2) ck.grouped_gemm = false;
        REQUIRE_MSG(moe_new(&s->m, &ck, s->be, N) == 0, "%s", co_err_detail());
        s->x = gu_buf(s->be, x, Nh);
        s->dy = gu_buf(s->be, dy, Nh);
        s->params = gu_buf(s->be, params, P);
        s->y = gu_buf(s->be, NULL, Nh);
        s->dx = gu_buf(s->be, NULL, Nh);
        s->dparams = gu_buf(s->be, NULL, P);
        run_side(s, &c, B, T, bias, &out[k == 2 ? 3 : k]);
    }
    run_side(&sd[1], &c, B, T, bias, &out[2]);
    host_out *ref = &out[0], *g = &out[1];
    CHECK_MSG(memcmp(ref->map, g->map, NE) == 0, "%s: routing maps differ", name);
    CHECK_MSG(memcmp(ref->tpe, g->tpe, sizeof(int32_t) * (size_t)E) == 0, "%s: tokens per expert differ", name);
    CHECK(ref->dropped == g->dropped);
    double wy = worst_ratio(g->y, ref->y, Nh, 1e-4, 1e-3), wdx = worst_ratio(g->dx, ref->dx, Nh, 1e-4, 1e-3);
    double wr = worst_ratio(g->dparams + off.router, ref->dparams + off.router, off.fc1 - off.router, 2e-4, 1e-3);
    double we = worst_ratio(g->dparams + off.fc1, ref->dparams + off.fc1, P - off.fc1, 2e-4, 1e-3);
    fprintf(stderr, "  %-40s error / tolerance: y %.3f dx %.3f dWr %.3f experts %.3f; aux %.2e z %.2e relative\n", name,
            wy, wdx, wr, we, fabs(g->aux - ref->aux) / fmax(ref->aux, 1e-30), fabs(g->z - ref->z) / fmax(ref->z, 1e-30));
    CHECK(wy <= 1 && wdx <= 1 && wr <= 1 && we <= 1);
    CHECK(fabs(g->aux - ref->aux) <= 1e-4 * fabs(ref->aux));
    CHECK(fabs(g->z - ref->z) <= 1e-4 * fabs(ref->z));
    CHECK_MSG(memcmp(out[1].y, out[2].y, sizeof(float) * Nh) == 0 && memcmp(out[1].dx, out[2].dx, sizeof(float) * Nh) == 0 &&
                  memcmp(out[1].dparams, out[2].dparams, sizeof(float) * P) == 0,
              "%s: two GPU runs differ", name);
    if (empty >= 0) {
        int lo = N, hi = 0;
        for (int e = 0; e < E; e++)
            if (e != empty) lo = g->tpe[e] < lo ? g->tpe[e] : lo, hi = g->tpe[e] > hi ? g->tpe[e] : hi;
        fprintf(stderr, "  %-40s tokens per expert: %d (expert %d), others %d..%d\n", name, g->tpe[empty], empty, lo, hi);
        CHECK_MSG(g->tpe[empty] == 0, "%s: expert %d got %d tokens (meant to be empty)", name, empty, g->tpe[empty]);
        CHECK_MSG(lo < hi, "%s: the groups are not uneven", name);
    }
    if (c.grouped_gemm) { /* grouped CUDA against one product per expert on CUDA */
        host_out *pe = &out[3];
        CHECK_MSG(memcmp(pe->map, g->map, NE) == 0, "%s: per-expert routing map differs", name);
        double py = worst_ratio(g->y, pe->y, Nh, 1e-4, 1e-3), pdx = worst_ratio(g->dx, pe->dx, Nh, 1e-4, 1e-3);
        double pr = worst_ratio(g->dparams + off.router, pe->dparams + off.router, off.fc1 - off.router, 2e-4, 1e-3);
        double pw = worst_ratio(g->dparams + off.fc1, pe->dparams + off.fc1, P - off.fc1, 2e-4, 1e-3);
        fprintf(stderr, "  %-40s grouped vs per expert (CUDA): y %.3f dx %.3f dWr %.3f experts %.3f\n", name, py, pdx,
                pr, pw);
        CHECK(py <= 1 && pdx <= 1 && pr <= 1 && pw <= 1);
        if (empty >= 0) { /* the empty expert's weights get no gradient on either path */
            size_t F1 = c.swiglu ? 2 * (size_t)c.ffn_hidden : (size_t)c.ffn_hidden;
            const float *w1 = g->dparams + off.fc1 + (size_t)empty * F1 * c.hidden;
            const float *w2 = g->dparams + off.fc2 + (size_t)empty * c.hidden * c.ffn_hidden;
            bool zero = true;
            for (size_t i = 0; i < F1 * c.hidden; i++) zero &= w1[i] == 0.0f;
            for (size_t i = 0; i < (size_t)c.hidden * c.ffn_hidden; i++) zero &= w2[i] == 0.0f;
            CHECK_MSG(zero, "%s: the empty expert's weight gradient is not zero", name);
        }
    }
    for (int k = 0; k < nsides; k++) {
        side *s = &sd[k];
        float *bufs[] = {s->x, s->dy, s->params, s->y, s->dx, s->dparams};
        for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) s->be->ops->free(s->be, bufs[i]);
        moe_destroy(&s->m);
    }
    for (int k = 0; k < 4; k++) free_out(&out[k]);
    free(x);
    free(dy);
    free(params);
}

static void test_cuda_vs_cpu(void) {
    kb_backend *cpu = gu_backend(KB_DEVICE_CPU, false), *gpu = gu_backend(KB_DEVICE_CUDA, false);
    moe_config base = {.hidden = 64, .num_experts = 8, .ffn_hidden = 96, .topk = 2, .score = MOE_SCORE_SOFTMAX,
                       .lb = MOE_LB_AUX, .aux_coeff = 0.01f, .z_coeff = 1e-3f};
    moe_config c = base;
    c.shared_ffn = 48;
    check_config("softmax k2 aux z shared gelu", c, cpu, gpu, -1);
    c = base;
    c.score = MOE_SCORE_SIGMOID;
    c.expert_bias = true;
    c.topk = 4;
    c.num_groups = 4;
    c.group_topk = 2;
    c.capacity_factor = 1.0;
    c.pad_to_capacity = true;
    c.swiglu = true;
    c.lb = MOE_LB_SEQ_AUX;
    check_config("sigmoid k4 groups bias cap pad swiglu seq", c, cpu, gpu, -1);
    c = base;
    c.pre_softmax = true;
    c.capacity_factor = 0.75;
    c.drop = MOE_DROP_POSITION;
    check_config("pre-softmax k2 cap 0.75 position", c, cpu, gpu, -1);
    /* grouped products (--moe-grouped-gemm), uneven groups with an empty one */
    REQUIRE(gpu->ops->grouped_linear_forward && gpu->ops->grouped_linear_backward);
    c = base;
    c.grouped_gemm = true;
    c.score = MOE_SCORE_SIGMOID;
    c.expert_bias = true;
    check_config("grouped sigmoid k2 bias gelu", c, cpu, gpu, 5);
    c.swiglu = true;
    c.topk = 3;
    c.shared_ffn = 48;
    c.lb = MOE_LB_SEQ_AUX;
    check_config("grouped sigmoid k3 swiglu shared seq", c, cpu, gpu, 0);
    c = base;
    c.grouped_gemm = true;
    c.capacity_factor = 1.0;
    c.pad_to_capacity = true;
    check_config("grouped softmax k2 cap pad", c, cpu, gpu, -1);
    kb_backend_destroy(&gpu);
    kb_backend_destroy(&cpu);
}

/* the stand-in's counts of kernel launches and host waits, or NULL on a GPU */
static unsigned long (*launch_count)(void), (*sync_count)(void);

/* One bf16 forward and backward of layer m on G: y, dx, dparams into host copies; the
 * launches and host waits it took into *launches, *waits (0 on a GPU). */
static void bf16_pass(kb_backend *G, moe_layer *m, const float *x, const float *params, const float *dy, float *y,
                      float *dx, float *dparams, size_t Nh, size_t P, int B, int T, float *hy, float *hdx, float *hdp,
                      unsigned long *launches, unsigned long *waits) {
    const kb_ops *o = G->ops;
    o->zero(G, dparams, P);
    o->sync(G);
    unsigned long l0 = launch_count ? launch_count() : 0, w0 = sync_count ? sync_count() : 0;
    REQUIRE_MSG(moe_forward(m, y, x, params, NULL, B, T) == 0, "%s", co_err_detail());
    REQUIRE_MSG(moe_backward(m, dx, dparams, dy, x, params, 1.0f) == 0, "%s", co_err_detail());
    *launches = launch_count ? launch_count() - l0 : 0;
    *waits = sync_count ? sync_count() - w0 : 0;
    o->copy(G, hy, y, sizeof(float) * Nh);
    o->copy(G, hdx, dx, sizeof(float) * Nh);
    o->copy(G, hdp, dparams, sizeof(float) * P);
}

/* --bf16 on CUDA (bf16 mode), --moe-grouped-gemm, a shared expert:
 *   the experts' products on the step's bf16 weight copies (moe_set_params16) give the bits
 *   of the products converting their weights per call, with fewer kernel launches (no
 *   conversion of the weights);
 *   a bf16 input (moe_set_input16: the model's bf16 activations) gives the bits of the fp32
 *   input holding the same (bf16) values: the widening is exact and the router, the shared
 *   expert and the dispatch read the widened input;
 *   the forward and the backward wait for the device once each (the routing reads the
 *   logits, the router's backward the routing gradients; the permutations are device work). */
static void test_bf16_copies_and_input(void) {
    const char *mod = getenv("COHORT_CUDA_MODULE");
    void *hm = mod ? dlopen(mod, RTLD_NOW | RTLD_NOLOAD) : NULL;
    if (hm) *(void **)&launch_count = dlsym(hm, "cudasim_launch_count");
    if (hm) *(void **)&sync_count = dlsym(hm, "cudasim_sync_count");
    kb_backend *G = gu_backend(KB_DEVICE_CUDA, true);
    const kb_ops *o = G->ops;
    moe_config c = {.hidden = 64, .num_experts = 8, .ffn_hidden = 96, .topk = 2, .score = MOE_SCORE_SOFTMAX,
                    .lb = MOE_LB_AUX, .aux_coeff = 0.01f, .z_coeff = 1e-3f, .shared_ffn = 48, .grouped_gemm = true};
    int B = 2, T = 32, N = B * T;
    moe_offsets off;
    REQUIRE(moe_layout(&c, &off) == 0);
    size_t Nh = (size_t)N * c.hidden, P = off.total;
    float *hx = malloc(sizeof(float) * Nh), *hdy = malloc(sizeof(float) * Nh), *hp = malloc(sizeof(float) * P);
    for (size_t i = 0; i < Nh; i++) hx[i] = gu_uniform(), hdy[i] = gu_uniform();
    for (size_t i = 0; i < P; i++) hp[i] = 0.3f * gu_uniform();
    float *x = gu_buf(G, hx, Nh), *dy = gu_buf(G, hdy, Nh), *params = gu_buf(G, hp, P);
    float *y = gu_buf(G, NULL, Nh), *dx = gu_buf(G, NULL, Nh), *dparams = gu_buf(G, NULL, P);
    kb_bf16 *p16 = o->alloc(G, sizeof(kb_bf16) * P), *x16 = o->alloc(G, sizeof(kb_bf16) * Nh);
    float *xw = gu_buf(G, NULL, Nh), *scratch = gu_buf(G, NULL, Nh);
    o->to_bf16(G, p16, params, P);
    o->to_bf16(G, x16, x, Nh);
    o->gather_rows_bf16(G, xw, x16, NULL, N, c.hidden); /* the bf16 values in fp32 */
    float *r[3][3];
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 3; j++) r[k][j] = malloc(sizeof(float) * (j == 2 ? P : Nh));
    unsigned long la[3], wa[3];
    moe_layer *m = NULL;
    REQUIRE_MSG(moe_new(&m, &c, G, N) == 0, "%s", co_err_detail());
    /* 0: per-call conversion, fp32 input of bf16 values; 1: the copies; 2: the copies, bf16 input */
    bf16_pass(G, m, xw, params, dy, y, dx, dparams, Nh, P, B, T, r[0][0], r[0][1], r[0][2], &la[0], &wa[0]);
    moe_set_params16(m, p16);
    bf16_pass(G, m, xw, params, dy, y, dx, dparams, Nh, P, B, T, r[1][0], r[1][1], r[1][2], &la[1], &wa[1]);
    REQUIRE(moe_set_input16(m, scratch) == 0);
    bf16_pass(G, m, (const float *)(const void *)x16, params, dy, y, dx, dparams, Nh, P, B, T, r[2][0], r[2][1],
              r[2][2], &la[2], &wa[2]);
    CHECK_MSG(G->status == 0, "status %d %s", G->status, co_err_detail());
    for (int k = 1; k < 3; k++)
        CHECK_MSG(!memcmp(r[k][0], r[0][0], sizeof(float) * Nh) && !memcmp(r[k][1], r[0][1], sizeof(float) * Nh) &&
                      !memcmp(r[k][2], r[0][2], sizeof(float) * P),
                  "bf16 %s: not bitwise the per-call conversion's", k == 1 ? "weight copies" : "input");
    fprintf(stderr, "  bf16 layer: %lu launches converting per call, %lu on the copies, %lu with bf16 input; "
            "host waits %lu %lu %lu\n", la[0], la[1], la[2], wa[0], wa[1], wa[2]);
    if (launch_count) CHECK_MSG(la[1] < la[0], "the weight copies saved no launch (%lu, %lu)", la[1], la[0]);
    if (sync_count) CHECK_MSG(wa[0] == 2 && wa[1] == 2 && wa[2] == 2, "host waits %lu %lu %lu (2 expected)", wa[0],
                              wa[1], wa[2]);
    moe_destroy(&m);
    float *bufs[] = {x, dy, params, y, dx, dparams, xw, scratch};
    for (size_t i = 0; i < sizeof bufs / sizeof bufs[0]; i++) o->free(G, bufs[i]);
    o->free(G, p16);
    o->free(G, x16);
    for (int k = 0; k < 3; k++)
        for (int j = 0; j < 3; j++) free(r[k][j]);
    free(hx), free(hdy), free(hp);
    kb_backend_destroy(&G);
}

int main(void) {
    gu_require_gpu();
    RUN(test_cuda_vs_cpu);
    RUN(test_bf16_copies_and_input);
    return TEST_EXIT();
}
