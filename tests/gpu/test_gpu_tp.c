/* test_gpu_tp.c - tensor and sequence parallelism (model/gpt.h) on the CUDA backend against
 * one rank on the CUDA backend, and loosely against one rank on the CPU backend.
 *
 * Each case forks tp = 2 rank processes that share GPU 0, each with its own CUDA backend,
 * joined by a ZeroMQ tensor group over ipc (the structure of tests/unit/model/test_gpt_tp.c).
 * Every rank trains, on the same global batches and from the same initial weights (the tp
 * model keeps its slice of the global draw):
 *   ref: the tp 1 model on the CUDA backend,
 *   cpu: the tp 1 model on the CPU backend,
 *   a:   its slice of the tp model on the CUDA backend,
 *   b:   the same again, the input-gradient sums not overlapped with the weight gradients,
 * and checks a against ref (this rank's slice of every one-rank tensor, gpt_tensor_take_slice):
 *   - the loss of every micro batch within LOSS_RTOL;
 *   - every gradient after the first backward (and gpt_tp_finalize_grads) within
 *     GRAD_ATOL + GRAD_RTOL |g|;
 *   - every parameter after STEPS AdamW steps within PARAM_ATOL + PARAM_RTOL |p|;
 * b bitwise equal to a (losses, gradients, weights); and a against cpu within the CPU_*
 * tolerances (per tensor, the gradient's absolute tolerance scales with the tensor's largest
 * one-rank gradient).
 *
 * Tolerances: test_gpt_tp's on the CPU are LOSS 2e-6, GRAD 2e-7 + 2e-4 |g|, PARAM 2e-6 +
 * 1e-4 |p|; here 5 times those. The tp model's sums differ from one rank's in the order of
 * additions only (fp32 throughout, no TF32), as on the CPU, but on the GPU the products of
 * other shapes may also run other cuBLASLt algorithms (split-k) and the vocabulary-parallel
 * cross-entropy sums in other blocks. The CPU comparison allows what tests/gpu/test_gpu_model.c
 * allows between the backends: loss 1e-4 relative, gradients 2e-4 max|g| + 1e-3 |g|, weights
 * after the steps 1e-4 + 1e-3 |p|. AdamW's epsilon is 1e-3 (as in test_gpt_tp: the key biases'
 * true gradient is 0, and a tiny epsilon would turn rounding noise there into full steps).
 *
 * CUDA is never initialised in the parent: a CUDA context does not survive fork, so even the
 * check for a GPU runs in a child. Exits 77 without a GPU. */
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

#define LOSS_RTOL 1e-5
#define GRAD_ATOL 1e-6
#define GRAD_RTOL 1e-3
#define PARAM_ATOL 1e-5
#define PARAM_RTOL 5e-4
#define CPU_LOSS_RTOL 1e-4
#define CPU_GRAD_ATOL_REL 2e-4 /* x the tensor's largest |g| */
#define CPU_GRAD_RTOL 1e-3
#define CPU_PARAM_ATOL 1e-4
#define CPU_PARAM_RTOL 1e-3
#define STEPS 3
#define MB 2 /* micro batches per step */
#define TP 2

typedef struct tcase {
    const char *name;
    bool sp;
    int heads, kv;
    bool swiglu, rope, rms, tied, bias, reset;
    int vocab;
    float hidden_dropout;
} tcase;

static const tcase cases[] = {
    {"tp2 mha gelu learned untied", false, 4, 4, false, false, false, false, true, false, 50, 0},
    {"tp2 sp mha gelu learned untied", true, 4, 4, false, false, false, false, true, false, 50, 0},
    {"tp2 sp gqa(1<tp) gelu tied dropout", true, 4, 1, false, false, false, true, true, false, 37, 0.1f},
    {"tp2 sp gqa(2=tp) swiglu rope rms reset dropout", true, 4, 2, true, true, true, false, true, true, 50, 0.1f},
    /* 1337 padded to 1340: 670 columns a rank, more than one block of the CE kernels */
    {"tp2 gqa(1<tp) swiglu rope tied odd vocab", false, 4, 1, true, true, false, true, false, false, 1337, 0},
};

enum { B = 2, T = 16, N = B * T };

static gpt_config config(const tcase *k, int tp, int rank) {
    gpt_config c = {.num_layers = 2, .hidden = 64, .heads = k->heads, .kv_groups = k->kv, .head_dim = 16,
                    .ffn_hidden = 128, .vocab = k->vocab, .max_positions = T, .rope = k->rope,
                    .rotary_base = 10000.0f, .rmsnorm = k->rms, .norm_eps = 1e-5f, .swiglu = k->swiglu,
                    .tied = k->tied, .bias = k->bias, .init_std = 0.2f, .hidden_dropout = k->hidden_dropout,
                    .tp = tp, .tp_rank = rank, .sequence_parallel = tp > 1 && k->sp};
    /* the vocabulary padded as Megatron pads it for tp 2, at tp 1 too (the same model) */
    c.padded_vocab = gpt_padded_vocab(k->vocab, 2 * TP);
    return c;
}

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
        bb->seg[i] = k->reset && t >= 5 ? 5 : 0;
        bb->pos[i] = k->reset ? t - bb->seg[i] : t;
        bb->mask[i] = i % 7 == 2 ? 0.0f : 1.0f;
    }
    double ntok = 0;
    for (int i = 0; i < N; i++) ntok += bb->mask[i];
    for (int i = 0; i < N; i++) bb->dscale[i] = bb->mask[i] / (float)(ntok * MB);
    bb->b = (gpt_batch){.B = B, .T = T, .tokens = bb->tok, .targets = bb->tgt, .positions = bb->pos,
                        .seg = k->reset ? bb->seg : NULL, .loss_mask = bb->mask};
}

/* What one run records (host copies): the losses of every micro batch, the gradients after
 * step 0, the weights after the last step. */
typedef struct run_out {
    double loss[STEPS][MB];
    float *grad0, *params;
    size_t n;
} run_out;

static int train(const tcase *k, kb_device dev, int tp, int rank, cm_comm *comm, bool overlap, run_out *out) {
    kb_backend *be = NULL;
    kb_options bo = {.device = dev, .threads = 1, .cuda_device = 0};
    int rc = kb_backend_new(&be, &bo);
    if (rc) {
        fprintf(stderr, "rank %d: %s backend: %s\n", rank, dev == KB_DEVICE_CUDA ? "CUDA" : "CPU", co_err_detail());
        return rc;
    }
    const kb_ops *o = be->ops;
    gpt_config c = config(k, tp, rank);
    gpt_model *m = NULL;
    if ((rc = gpt_new(&m, &c, be, B, T))) {
        fprintf(stderr, "rank %d: gpt_new: %s\n", rank, co_err_detail());
        kb_backend_destroy(&be);
        return rc;
    }
    if (tp > 1) gpt_set_tensor_group(m, comm, 60000);
    gpt_tp_set_overlap(m, overlap);
    gpt_init(m, 42);
    size_t n = gpt_num_params(m);
    /* the moments in backend memory: the CUDA backend's adamw runs on the GPU */
    float *mom = o->alloc(be, n * sizeof(float)), *var = o->alloc(be, n * sizeof(float));
    out->n = n;
    out->grad0 = malloc(n * sizeof(float));
    out->params = malloc(n * sizeof(float));
    if (!mom || !var || !out->grad0 || !out->params) rc = CO_ENOMEM;
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
            fprintf(stderr, "rank %d step %d: %s: %s\n", rank, s, co_err_name(rc), co_err_detail());
            break;
        }
        if (s == 0) o->copy(be, out->grad0, gpt_grads(m), n * sizeof(float)); /* waits for the backend */
        o->adamw(be, gpt_params(m), gpt_grads(m), mom, var, n, 1e-2f, 0.9f, 0.95f, 1e-3f, 0.1f, 1.0f, s + 1);
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
 * |want|: the worst error as a fraction of the tolerance; the first few misses said. */
static double compare(const tcase *k, int rank, const gpt_tensor *t, const char *what, const float *got,
                      const float *want, double atol, double rtol, int *bad) {
    double worst = 0;
    for (size_t j = 0; j < t->numel; j++) {
        double e = fabs((double)got[j] - want[j]) / (atol + rtol * fabs(want[j]));
        if (!(e <= worst)) worst = isnan(e) ? INFINITY : e;
        if (!(e <= 1) && (*bad)++ < 5)
            CHECK_MSG(0, "%s rank %d: %s of %s[%zu]: %.9g vs %.9g", k->name, rank, what, t->name, j, got[j], want[j]);
    }
    return worst;
}

static double max_abs(const float *x, size_t n) {
    double m = 0;
    for (size_t i = 0; i < n; i++) m = fmax(m, fabs(x[i]));
    return m;
}

/* One rank of a case: the references, the tp run twice, the comparisons. */
static void rank_main(const tcase *k, int rank, const char *dir) {
    char eps[TP][300];
    const char *ep[TP];
    for (int r = 0; r < TP; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    zo.connect_timeout_ms = 60000;
    zo.linger_ms = 1000;
    cm_comm *comm = NULL;
    int rc = cm_zmq_new(&comm, rank, TP, ep, &zo);
    REQUIRE(rc == 0);

    run_out ref = {0}, cpu = {0}, a = {0}, b = {0};
    REQUIRE(train(k, KB_DEVICE_CUDA, 1, 0, NULL, true, &ref) == 0);
    REQUIRE(train(k, KB_DEVICE_CPU, 1, 0, NULL, true, &cpu) == 0);
    REQUIRE(train(k, KB_DEVICE_CUDA, TP, rank, comm, true, &a) == 0);
    REQUIRE(train(k, KB_DEVICE_CUDA, TP, rank, comm, false, &b) == 0);

    /* the tensor tables of both layouts, to slice the references (a CPU backend: the tables
     * only) */
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    REQUIRE(kb_backend_new(&be, &bo) == 0);
    gpt_config c1 = config(k, 1, 0), ct = config(k, TP, rank);
    gpt_model *m1 = NULL, *mt = NULL;
    REQUIRE(gpt_new(&m1, &c1, be, B, T) == 0);
    REQUIRE(gpt_new(&mt, &ct, be, B, T) == 0);
    REQUIRE(gpt_num_tensors(m1) == gpt_num_tensors(mt));
    const gpt_tensor *t1 = gpt_tensors(m1), *tt = gpt_tensors(mt);

    double wl = 0, wl_cpu = 0, wg = 0, wp = 0, wg_cpu = 0, wp_cpu = 0;
    for (int s = 0; s < STEPS; s++)
        for (int mb = 0; mb < MB; mb++) {
            double x = a.loss[s][mb], y = ref.loss[s][mb], z = cpu.loss[s][mb];
            double e = fabs(x - y) / fmax(fabs(y), 1e-30), ec = fabs(x - z) / fmax(fabs(z), 1e-30);
            wl = fmax(wl, e);
            wl_cpu = fmax(wl_cpu, ec);
            CHECK_MSG(e <= LOSS_RTOL, "%s rank %d: step %d micro batch %d: loss %.9g vs one rank's %.9g", k->name,
                      rank, s, mb, x, y);
            CHECK_MSG(ec <= CPU_LOSS_RTOL, "%s rank %d: step %d micro batch %d: loss %.9g vs one CPU rank's %.9g",
                      k->name, rank, s, mb, x, z);
            CHECK_MSG(memcmp(&a.loss[s][mb], &b.loss[s][mb], sizeof(double)) == 0,
                      "%s rank %d: step %d: loss not bitwise reproducible", k->name, rank, s);
        }
    size_t maxn = 0;
    for (int i = 0; i < gpt_num_tensors(mt); i++) maxn = tt[i].numel > maxn ? tt[i].numel : maxn;
    float *want = malloc(sizeof(float) * maxn);
    REQUIRE(want);
    int bad_g = 0, bad_p = 0, bad_gc = 0, bad_pc = 0;
    for (int i = 0; i < gpt_num_tensors(mt); i++) {
        const gpt_tensor *t = &tt[i];
        REQUIRE(strcmp(t1[i].name, t->name) == 0);
        CHECK(t->gshape[0] == t1[i].shape[0] && t->gshape[1] == t1[i].shape[1]);
        const float *ga = a.grad0 + t->offset, *pa = a.params + t->offset;
        gpt_tensor_take_slice(t, ref.grad0 + t1[i].offset, want);
        wg = fmax(wg, compare(k, rank, t, "gradient", ga, want, GRAD_ATOL, GRAD_RTOL, &bad_g));
        gpt_tensor_take_slice(t, ref.params + t1[i].offset, want);
        wp = fmax(wp, compare(k, rank, t, "weight after the steps", pa, want, PARAM_ATOL, PARAM_RTOL, &bad_p));
        gpt_tensor_take_slice(t, cpu.grad0 + t1[i].offset, want);
        double gmax = max_abs(cpu.grad0 + t1[i].offset, t1[i].numel);
        wg_cpu = fmax(wg_cpu, compare(k, rank, t, "gradient (vs the CPU)", ga, want, CPU_GRAD_ATOL_REL * gmax + 1e-12,
                                      CPU_GRAD_RTOL, &bad_gc));
        gpt_tensor_take_slice(t, cpu.params + t1[i].offset, want);
        wp_cpu = fmax(wp_cpu, compare(k, rank, t, "weight after the steps (vs the CPU)", pa, want, CPU_PARAM_ATOL,
                                      CPU_PARAM_RTOL, &bad_pc));
    }
    CHECK_MSG(bad_g == 0, "%s rank %d: %d gradients differ from one GPU rank's", k->name, rank, bad_g);
    CHECK_MSG(bad_p == 0, "%s rank %d: %d parameters differ from one GPU rank's", k->name, rank, bad_p);
    CHECK_MSG(bad_gc == 0, "%s rank %d: %d gradients differ from one CPU rank's", k->name, rank, bad_gc);
    CHECK_MSG(bad_pc == 0, "%s rank %d: %d parameters differ from one CPU rank's", k->name, rank, bad_pc);
    CHECK_MSG(memcmp(a.grad0, b.grad0, a.n * sizeof(float)) == 0, "%s rank %d: gradients not bitwise reproducible",
              k->name, rank);
    CHECK_MSG(memcmp(a.params, b.params, a.n * sizeof(float)) == 0, "%s rank %d: weights not bitwise reproducible",
              k->name, rank);
    fprintf(stderr,
            "  %-48s rank %d: vs one GPU rank: loss %.1e relative, error / tolerance: gradients %.3f, weights %.3f;"
            " vs one CPU rank: loss %.1e, gradients %.3f, weights %.3f\n",
            k->name, rank, wl, wg, wp, wl_cpu, wg_cpu, wp_cpu);
    free(want);
    run_out *runs[] = {&ref, &cpu, &a, &b};
    for (int i = 0; i < 4; i++) free(runs[i]->grad0), free(runs[i]->params);
    gpt_destroy(&m1);
    gpt_destroy(&mt);
    kb_backend_destroy(&be);
    cm_destroy(&comm);
}

static void run_case(const tcase *k) {
    char dir[256];
    REQUIRE(t_scratch_dir(dir, sizeof dir, "gpu-tp") == 0);
    pid_t pid[TP];
    fflush(stderr);
    for (int r = 0; r < TP; r++) {
        pid[r] = fork();
        if (pid[r] == 0) {
            alarm(300);
            t__failures = 0;
            rank_main(k, r, dir);
            fflush(stderr);
            _exit(t__failures ? 1 : 0);
        }
        REQUIRE(pid[r] > 0);
    }
    for (int r = 0; r < TP; r++) {
        int st = 0;
        waitpid(pid[r], &st, 0);
        CHECK_MSG(WIFEXITED(st) && WEXITSTATUS(st) == 0, "%s: rank %d ended with status %#x", k->name, r, st);
    }
    t_remove_dir(dir);
}

static void test_tp_matches_one_rank(void) {
    for (size_t i = 0; i < sizeof cases / sizeof cases[0]; i++) run_case(&cases[i]);
}

/* Exits 77 when there is no usable GPU. The check runs in a child, so this process never
 * initialises CUDA before it forks the ranks. */
static void require_gpu_in_child(void) {
    fflush(stderr);
    pid_t pid = fork();
    if (pid < 0) {
        perror("fork");
        exit(1);
    }
    if (pid == 0) {
        char why[256];
        if (!kb_cuda_available(why, sizeof why)) {
            fprintf(stderr, "skip: %s\n", why);
            fflush(stderr);
            _exit(77);
        }
        _exit(0);
    }
    int st = 0;
    waitpid(pid, &st, 0);
    if (WIFEXITED(st) && WEXITSTATUS(st) == 77) exit(77);
    if (!WIFEXITED(st) || WEXITSTATUS(st) != 0) {
        fprintf(stderr, "the GPU check ended with status %#x\n", st);
        exit(1);
    }
}

int main(void) {
    signal(SIGPIPE, SIG_IGN);
    require_gpu_in_child();
    RUN(test_tp_matches_one_rank);
    return TEST_EXIT();
}
