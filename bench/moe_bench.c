/* moe_bench.c - the MoE layer (model/moe.c): the experts as grouped products against one
 * product per expert (CPU or CUDA backend), and expert parallelism against data parallelism
 * (CPU).
 *
 *   moe_bench grouped [--threads 2] [--device cpu|cuda] [shape]
 *       one process: forward + backward of the layer, one product per expert, then grouped
 *       (--moe-grouped-gemm); ms per step each and the speedup. --device cuda: the CUDA
 *       backend on GPU 0 (its grouped products are cuBLAS's grouped GEMM), the layer's
 *       buffers in backend (managed) memory, each timing ended by a sync.
 *   moe_bench products --rows R [--threads 2] [shape]
 *       the experts' products alone (no router, permutation or activation): fc1 and fc2
 *       forward and backward of E experts with R rows each, one backend product per expert
 *       (kb_ops.linear_*) against the grouped call (kb_ops.grouped_linear_*); the best of
 *       --steps after --warmup, ms and GFLOP/s each, and the speedup.
 *   moe_bench ep --ranks P --ep E [--dispatcher alltoall|allgather] [--grouped] [shape]
 *       P forked ranks (1 thread each), each with its own tokens; --ep 1 is data parallel
 *       (every rank computes every expert, nothing exchanged), --ep P splits the experts.
 *       Per rank: ms per step, the share of the step in dispatch and combine, bytes sent
 *       per step on the transport (ZeroMQ and shared memory, cm_zmq_traffic) against the
 *       analytic volume from the step's routing; then the tokens per second of all ranks.
 *   shape: --experts 8 --topk 2 --hidden 256 --ffn 1024 --tokens 2048 --steps 10 --warmup 2
 * One step = moe_forward + moe_backward over `tokens` tokens (one sequence each of 256)
 * with softmax top-k routing and the aux loss; weights N(0, 0.02), tokens N(0, 1). The
 * layer only: no optimizer, no data-parallel reduction of the gradients. */
#include "bench/bench_cpu.h"
#include "comm/zmq_comm.h"
#include "common/error.h"
#include "common/rng.h"
#include "kernels/backend.h"
#include "model/moe.h"

#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

static double now_s(void) {
    struct timespec ts;
    clock_gettime(CLOCK_MONOTONIC, &ts);
    return (double)ts.tv_sec + 1e-9 * (double)ts.tv_nsec;
}

typedef struct args {
    int experts, topk, hidden, ffn, tokens, steps, warmup, threads, ranks, ep;
    bool grouped, cuda;
    moe_dispatcher disp;
} args;

static moe_config config_of(const args *a, bool grouped, int ep) {
    moe_config c = {.hidden = a->hidden, .num_experts = a->experts, .ffn_hidden = a->ffn, .topk = a->topk,
                    .score = MOE_SCORE_SOFTMAX, .lb = MOE_LB_AUX, .aux_coeff = 0.01f, .drop = MOE_DROP_PROBS,
                    .grouped_gemm = grouped, .ep_size = ep};
    return c;
}

typedef struct layer {
    kb_backend *be;
    moe_layer *m;
    float *x, *dy, *y, *dx, *params, *dparams;
    size_t P;
} layer;

static int layer_new(layer *L, const moe_config *c, kb_backend *be, int N, uint64_t seed) {
    memset(L, 0, sizeof *L);
    int rc = moe_new(&L->m, c, be, N);
    if (rc) return rc;
    L->P = moe_layer_offsets(L->m)->total;
    size_t Nh = (size_t)N * c->hidden;
    /* backend memory (zeroed; on CUDA managed, so the host fills it below) */
    const kb_ops *o = be->ops;
    L->be = be;
    L->x = o->alloc(be, 4 * Nh), L->dy = o->alloc(be, 4 * Nh), L->y = o->alloc(be, 4 * Nh);
    L->dx = o->alloc(be, 4 * Nh), L->params = o->alloc(be, 4 * L->P), L->dparams = o->alloc(be, 4 * L->P);
    if (!L->x || !L->dy || !L->y || !L->dx || !L->params || !L->dparams) return CO_ENOMEM;
    co_rng g;
    co_rng_seed(&g, seed);
    for (size_t i = 0; i < Nh; i++) L->x[i] = (float)co_rng_normal(&g);
    for (size_t i = 0; i < Nh; i++) L->dy[i] = (float)(1e-3 * co_rng_normal(&g));
    for (size_t i = 0; i < L->P; i++) L->params[i] = (float)(0.02 * co_rng_normal(&g));
    return 0;
}

static void layer_free(layer *L) {
    moe_destroy(&L->m);
    float *bufs[] = {L->x, L->dy, L->y, L->dx, L->params, L->dparams};
    for (int i = 0; i < 6; i++)
        if (L->be) L->be->ops->free(L->be, bufs[i]);
}

static int step(layer *L, int N) {
    int rc = moe_forward(L->m, L->y, L->x, L->params, NULL, N / 256 > 0 ? N / 256 : 1, N / 256 > 0 ? 256 : N);
    if (!rc) rc = moe_backward(L->m, L->dx, L->dparams, L->dy, L->x, L->params, 1.0f);
    L->be->ops->sync(L->be); /* CUDA: the step's queued products are part of its time */
    if (!rc) rc = kb_backend_status(L->be);
    return rc;
}

static double time_steps(layer *L, const args *a) {
    for (int i = 0; i < a->warmup; i++)
        if (step(L, a->tokens)) return -1;
    double t0 = now_s();
    for (int i = 0; i < a->steps; i++)
        if (step(L, a->tokens)) return -1;
    return (now_s() - t0) / a->steps;
}

static int run_grouped(const args *a) {
    kb_backend *be = NULL;
    kb_options bo = {.device = a->cuda ? KB_DEVICE_CUDA : KB_DEVICE_CPU, .threads = a->threads};
    if (kb_backend_new(&be, &bo)) {
        fprintf(stderr, "moe_bench: %s\n", co_err_detail());
        return 1;
    }
    double t[2];
    for (int g = 0; g < 2; g++) {
        moe_config c = config_of(a, g == 1, 0);
        layer L;
        if (layer_new(&L, &c, be, a->tokens, 7)) {
            fprintf(stderr, "moe_bench: %s\n", co_err_detail());
            return 1;
        }
        t[g] = time_steps(&L, a);
        layer_free(&L);
        if (t[g] < 0) {
            fprintf(stderr, "moe_bench: %s\n", co_err_detail());
            return 1;
        }
    }
    printf("grouped (%s): %d experts, top-%d, hidden %d, ffn %d, %d tokens, %d threads: one product per expert "
           "%.1f ms/step, grouped %.1f ms/step, speedup %.2fx\n",
           kb_backend_describe(be), a->experts, a->topk, a->hidden, a->ffn, a->tokens, a->threads, 1e3 * t[0],
           1e3 * t[1], t[0] / t[1]);
    kb_backend_destroy(&be);
    return 0;
}

/* the products alone: per expert against grouped, R = rows per expert */
static int run_products(const args *a, int R) {
    kb_backend *be = NULL;
    kb_options bo = {.device = a->cuda ? KB_DEVICE_CUDA : KB_DEVICE_CPU, .threads = a->threads};
    if (R < 1 || kb_backend_new(&be, &bo)) {
        fprintf(stderr, "moe_bench: %s\n", R < 1 ? "--rows must be positive" : co_err_detail());
        return R < 1 ? 2 : 1;
    }
    const kb_ops *o = be->ops;
    int E = a->experts, h = a->hidden, F = a->ffn;
    size_t M = (size_t)E * R, W = (size_t)E * F * h;
    float *x = o->alloc(be, 4 * M * h), *act = o->alloc(be, 4 * M * F), *y = o->alloc(be, 4 * M * h);
    float *da = o->alloc(be, 4 * M * F), *dx = o->alloc(be, 4 * M * h);
    float *W1 = o->alloc(be, 4 * W), *W2 = o->alloc(be, 4 * W), *dW1 = o->alloc(be, 4 * W), *dW2 = o->alloc(be, 4 * W);
    int32_t *off = malloc(sizeof *off * (size_t)(E + 1));
    if (!x || !act || !y || !da || !dx || !W1 || !W2 || !dW1 || !dW2 || !off) {
        fprintf(stderr, "moe_bench: out of memory\n");
        return 1;
    }
    co_rng g;
    co_rng_seed(&g, 3);
    for (size_t i = 0; i < M * h; i++) x[i] = (float)co_rng_normal(&g);
    for (size_t i = 0; i < W; i++) W1[i] = (float)(0.02 * co_rng_normal(&g)), W2[i] = (float)(0.02 * co_rng_normal(&g));
    for (int e = 0; e <= E; e++) off[e] = e * R;
    double best[2] = {1e30, 1e30};
    for (int it = 0; it < a->warmup + a->steps; it++)
        for (int mode = 0; mode < 2; mode++) {
            double t0 = now_s();
            if (mode == 0) { /* one product per expert, as moe.c without --moe-grouped-gemm */
                for (int e = 0; e < E; e++)
                    o->linear_forward(be, act + (size_t)off[e] * F, x + (size_t)off[e] * h, W1 + (size_t)e * F * h,
                                      NULL, NULL, R, h, F);
                for (int e = 0; e < E; e++)
                    o->linear_forward(be, y + (size_t)off[e] * h, act + (size_t)off[e] * F, W2 + (size_t)e * F * h,
                                      NULL, NULL, R, F, h);
                for (int e = 0; e < E; e++)
                    o->linear_backward(be, da + (size_t)off[e] * F, dW2 + (size_t)e * F * h, NULL,
                                       y + (size_t)off[e] * h, act + (size_t)off[e] * F, W2 + (size_t)e * F * h,
                                       NULL, R, F, h);
                for (int e = 0; e < E; e++)
                    o->linear_backward(be, dx + (size_t)off[e] * h, dW1 + (size_t)e * F * h, NULL,
                                       da + (size_t)off[e] * F, x + (size_t)off[e] * h, W1 + (size_t)e * F * h, NULL,
                                       R, h, F);
            } else {
                o->grouped_linear_forward(be, act, x, W1, off, E, h, F);
                o->grouped_linear_forward(be, y, act, W2, off, E, F, h);
                o->grouped_linear_backward(be, da, dW2, y, act, W2, off, E, F, h);
                o->grouped_linear_backward(be, dx, dW1, da, x, W1, off, E, h, F);
            }
            o->sync(be);
            double dt = now_s() - t0;
            if (it >= a->warmup && dt < best[mode]) best[mode] = dt;
        }
    int rc = kb_backend_status(be);
    double flop = 6.0 * 2.0 * (double)M * h * F; /* two products, forward and two backward each */
    if (!rc)
        printf("products (%s): %d experts x %d rows, hidden %d, ffn %d: one product per expert %.2f ms (%.0f GFLOP/s), "
               "grouped %.2f ms (%.0f GFLOP/s), speedup %.2fx\n",
               kb_backend_describe(be), E, R, h, F, 1e3 * best[0], flop / best[0] / 1e9, 1e3 * best[1],
               flop / best[1] / 1e9, best[0] / best[1]);
    float *bufs[] = {x, act, y, da, dx, W1, W2, dW1, dW2};
    for (int i = 0; i < 9; i++) o->free(be, bufs[i]);
    free(off);
    kb_backend_destroy(&be);
    return rc ? 1 : 0;
}

static int rank_main(const args *a, int rank, const char *dir) {
    char eps[8][300];
    const char *ep[8];
    for (int r = 0; r < a->ranks; r++) {
        snprintf(eps[r], sizeof eps[r], "ipc://%s/r%d", dir, r);
        ep[r] = eps[r];
    }
    cm_zmq_options zo;
    cm_zmq_options_default(&zo);
    cm_comm *world = NULL;
    if (cm_zmq_new(&world, rank, a->ranks, ep, &zo)) {
        fprintf(stderr, "rank %d: cm_zmq_new: %s\n", rank, co_err_detail());
        return 1;
    }
    /* the expert group: consecutive ranks */
    cm_comm *grp = NULL;
    int members[8], g0 = rank / a->ep * a->ep;
    for (int i = 0; i < a->ep; i++) members[i] = g0 + i;
    if (a->ep > 1 && world->ops->split(world, members, a->ep, &grp)) {
        fprintf(stderr, "rank %d: split: %s\n", rank, co_err_detail());
        return 1;
    }
    kb_backend *be = NULL;
    kb_options bo = {.device = KB_DEVICE_CPU, .threads = 1};
    if (kb_backend_new(&be, &bo)) return 1;
    moe_config c = config_of(a, a->grouped, a->ep);
    layer L;
    int rc = layer_new(&L, &c, be, a->tokens, 100 + (uint64_t)rank);
    if (!rc && grp) rc = moe_set_expert_group(L.m, grp, a->disp, 60000);
    if (rc) {
        fprintf(stderr, "rank %d: %s\n", rank, co_err_detail());
        return 1;
    }
    for (int i = 0; i < a->warmup; i++)
        if (step(&L, a->tokens)) return 1;
    world->ops->barrier(world, 60000);
    uint64_t z0, s0, z1, s1;
    cm_zmq_traffic(world, &z0, &s0);
    double d0 = moe_ep_dispatch_seconds(L.m), t0 = now_s();
    for (int i = 0; i < a->steps; i++)
        if ((rc = step(&L, a->tokens))) {
            fprintf(stderr, "rank %d: %s\n", rank, co_err_detail());
            return 1;
        }
    double dt = (now_s() - t0) / a->steps, disp = (moe_ep_dispatch_seconds(L.m) - d0) / a->steps;
    cm_zmq_traffic(world, &z1, &s1);
    double sent = (double)(z1 - z0 + s1 - s0) / a->steps;
    /* the analytic volume of the last step from its routing: alltoall sends, per step, the
     * rows for remote experts out and back twice (forward tokens and backward output
     * gradients out; outputs and input gradients back) plus the counts; allgather sends
     * (P-1) blocks of every gathered or reduce-scattered tensor */
    double analytic = 0, balanced = 0;
    int P = a->ep, E = a->experts, El = E / (P > 0 ? P : 1), N = a->tokens, h = a->hidden, k = a->topk;
    if (P > 1) {
        const int32_t *tpe = moe_tokens_per_expert(L.m);
        int32_t all[8 * 256];
        rc = grp->ops->allgather(grp, tpe, all, sizeof(int32_t) * (size_t)E, 60000);
        double out = 0, in = 0;
        int me = grp->rank;
        for (int e = 0; e < E; e++)
            if (e / El != me) out += tpe[e];
        for (int s = 0; s < P; s++)
            if (s != me)
                for (int j = 0; j < El; j++) in += all[s * E + me * El + j];
        if (a->disp == MOE_DISPATCH_ALLTOALL) {
            analytic = 2.0 * (out + in) * h * 4 + (double)(P - 1) * El * 4;
            balanced = 4.0 * N * k * (double)(P - 1) / P * h * 4;
        } else {
            analytic = (double)(P - 1) * ((double)N * (h + E) * 4 + (double)N * E + 3.0 * N * h * 4 + (double)N * E * 8);
            balanced = analytic;
        }
    }
    printf("rank %d: %.1f ms/step, dispatch+combine %.1f ms (%.1f%%), sent %.0f bytes/step, analytic %.0f "
           "(balanced routing %.0f)\n",
           rank, 1e3 * dt, 1e3 * disp, 100 * disp / dt, sent, analytic, balanced);
    fflush(stdout);
    /* the job's tokens per second: rank 0 from the slowest rank's step time */
    double all_dt[8] = {0};
    if (world->ops->allgather(world, &dt, all_dt, sizeof dt, 60000)) {
        fprintf(stderr, "rank %d: allgather: %s\n", rank, co_err_detail());
        return 1;
    }
    if (rank == 0) {
        double mx = 0;
        for (int r = 0; r < a->ranks; r++) mx = all_dt[r] > mx ? all_dt[r] : mx;
        printf("ep %d on %d ranks (%s%s): %.0f tokens/s (all ranks, slowest rank's step %.1f ms)\n", a->ep, a->ranks,
               a->ep > 1 ? (a->disp == MOE_DISPATCH_ALLTOALL ? "alltoall" : "allgather") : "data parallel",
               a->grouped ? ", grouped" : "", (double)a->ranks * a->tokens / mx, 1e3 * mx);
    }
    fflush(stdout);
    layer_free(&L);
    kb_backend_destroy(&be);
    cm_destroy(&grp);
    cm_destroy(&world);
    return 0;
}

int main(int argc, char **argv) {
    args a = {.experts = 8, .topk = 2, .hidden = 256, .ffn = 1024, .tokens = 2048, .steps = 10, .warmup = 2,
              .threads = 2, .ranks = 2, .ep = 1, .disp = MOE_DISPATCH_ALLTOALL};
    int rows = 64;
    if (argc < 2 || (strcmp(argv[1], "grouped") && strcmp(argv[1], "ep") && strcmp(argv[1], "products"))) {
        fprintf(stderr, "usage: moe_bench grouped|products|ep [options] (see bench/moe_bench.c)\n");
        return 2;
    }
    for (int i = 2; i < argc; i++) {
        const char *f = argv[i], *v = i + 1 < argc ? argv[i + 1] : NULL;
#define INT(name, field)                      \
    if (!strcmp(f, name) && v) {              \
        a.field = atoi(v);                    \
        i++;                                  \
        continue;                             \
    }
        INT("--experts", experts) INT("--topk", topk) INT("--hidden", hidden) INT("--ffn", ffn)
        INT("--tokens", tokens) INT("--steps", steps) INT("--warmup", warmup) INT("--threads", threads)
        INT("--ranks", ranks) INT("--ep", ep)
#undef INT
        if (!strcmp(f, "--rows") && v) {
            rows = atoi(v);
            i++;
            continue;
        }
        if (!strcmp(f, "--grouped")) {
            a.grouped = true;
            continue;
        }
        if (!strcmp(f, "--device") && v && (!strcmp(v, "cpu") || !strcmp(v, "cuda"))) {
            a.cuda = !strcmp(v, "cuda");
            i++;
            continue;
        }
        if (!strcmp(f, "--dispatcher") && v) {
            a.disp = !strcmp(v, "allgather") ? MOE_DISPATCH_ALLGATHER : MOE_DISPATCH_ALLTOALL;
            i++;
            continue;
        }
        fprintf(stderr, "moe_bench: unknown option %s\n", f);
        return 2;
    }
    bench_cpu_print(stdout);
    if (!strcmp(argv[1], "grouped")) return run_grouped(&a);
    if (!strcmp(argv[1], "products")) return run_products(&a, rows);
    if (a.cuda) {
        fprintf(stderr, "moe_bench: ep runs on the CPU backend only (--device cuda is for grouped)\n");
        return 2;
    }
    if (a.ranks < 1 || a.ranks > 8 || a.ep < 1 || a.ranks % a.ep || a.experts % a.ep || a.experts > 256) {
        fprintf(stderr, "moe_bench: --ranks (1-8) must be a multiple of --ep, and --experts of --ep\n");
        return 2;
    }
    char dir[] = "/tmp/moe-bench-XXXXXX";
    if (!mkdtemp(dir)) return 1;
    pid_t pid[8];
    fflush(stdout);
    for (int r = 0; r < a.ranks; r++)
        if ((pid[r] = fork()) == 0) _exit(rank_main(&a, r, dir));
    int bad = 0;
    for (int r = 0; r < a.ranks; r++) {
        int st;
        waitpid(pid[r], &st, 0);
        bad += !WIFEXITED(st) || WEXITSTATUS(st);
    }
    char cmd[64];
    snprintf(cmd, sizeof cmd, "rm -rf %s", dir);
    if (system(cmd)) fprintf(stderr, "moe_bench: could not remove %s\n", dir);
    return bad ? 1 : 0;
}
